"""A verifier defined in a task file given by path (``tasks.module: ./mytask.py``) runs in its bounded worker,
wherever the working directory is and with the file's folder on no ``sys.path`` (issue 77 item 4)."""

from __future__ import annotations

import sys

from rlcr.tasks import registry

TASK_FILE = '''
from rlcr.tasks.verify import BoundedVerifier


def is_prime(n):
    return n > 1 and all(n % k for k in range(2, int(n ** 0.5) + 1))


VERIFY = BoundedVerifier("primefile_task:is_prime", timeout_s=5.0)
'''


def test_a_verifier_in_a_task_file_given_by_path_runs_in_its_worker(tmp_path, monkeypatch):
    """Before, the worker imported ``primefile_task`` by name from the caller's ``sys.path``, where the file's
    folder is not: every call returned None (the worker did not start) and a smoke run on the tiny model, which
    never writes an answer, did not show it."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    path = folder / "primefile_task.py"
    path.write_text(TASK_FILE)
    monkeypatch.chdir(tmp_path)  # neither the working directory nor sys.path holds the file's folder
    assert str(folder) not in sys.path
    try:
        module = registry.import_task_module(str(path))
        verify = module.VERIFY
        with verify.scoring(3) as stats:
            assert [verify(7), verify(8), verify(97)] == [True, False, True]
        assert stats.timeouts == 0
        verify._stop()
    finally:
        sys.modules.pop("primefile_task", None)


def test_a_verifier_importable_by_name_is_imported_by_name(tmp_path, monkeypatch):
    """A module on sys.path is not pinned to its file: the worker imports it by name, as before."""
    (tmp_path / "primename_task.py").write_text(TASK_FILE.replace("primefile_task", "primename_task"))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        import primename_task

        assert primename_task.VERIFY._module_file() == ""
        assert primename_task.VERIFY(11) is True
        primename_task.VERIFY._stop()
    finally:
        sys.modules.pop("primename_task", None)
