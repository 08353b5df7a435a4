"""What reaches the terminal while a command runs Ray, vLLM or Prefect (``rlcr train``, ``sft``, ``eval``,
``probe``, ``demo``): rlcr's own lines only.

Everything else the driver process and its children write (Prefect's flow and task-run lines, its temporary API
server and telemetry banner, Ray's start-up lines and warnings, Ray Data's execution plans, vLLM's start-up)
goes to one log file per command, ``<log dir>/<run id>/<command>-<YYYYmmdd-HHMMSS>.log`` (a command of no run,
``rlcr eval`` or ``rlcr sft``: ``<log dir>/<command>-<YYYYmmdd-HHMMSS>.log``), where the log dir is
``$RLCR_LOG_DIR`` or ``./rlcr-logs``: logs are per machine, so they live beside the command, not in the run's
(possibly remote) storage. The engines' and the trainer's own output stays in Ray's worker logs, as before.
``-v`` routes nothing: everything shows on the terminal, as before.

How: while :func:`routed` is active, file descriptors 1 and 2 point at the log file (so child processes and
libraries holding ``sys.stderr`` write there too) and :data:`rlcr.ui.presentation.console` writes to a copy of the
terminal's descriptor. On an exception the descriptors are restored, so the error line or traceback reaches the
terminal (after a Ctrl-C they stay routed: the interrupt says what stopped); on success they stay in the log until
the process ends (Prefect's and Ray's shutdown lines go there).
Either way the console is given back to ``sys.stdout`` when the command returns.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Callable, Iterator, Optional

__all__ = ["LOG_DIR_ENV", "DEFAULT_LOG_DIR", "log_file", "display_path", "routed", "QUIET_ENV"]

LOG_DIR_ENV = "RLCR_LOG_DIR"
DEFAULT_LOG_DIR = "rlcr-logs"
QUIET_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "DO_NOT_TRACK": "1",
             "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
"""Set (where unset) for a routed command: no usage-statistics banners (Ray's, Prefect's)."""


def log_file(run_id: Optional[str], command: str = "train") -> Path:
    """The log file of one ``rlcr <command>`` of run ``run_id`` (None: a command of no run) started now (not
    created here)."""
    root = Path(os.environ.get(LOG_DIR_ENV) or DEFAULT_LOG_DIR)
    return (root / run_id if run_id else root) / f"{command}-{time.strftime('%Y%m%d-%H%M%S')}.log"


def display_path(path: Path) -> str:
    """``path`` as the terminal shows it: relative to the working directory where it is under it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path.resolve())


@contextlib.contextmanager
def routed(path: Optional[Path], header: str = "", interrupted: Optional[Callable[[], bool]] = None) -> Iterator[None]:
    """Send descriptors 1 and 2 (and so every library's and child process's output) to ``path`` and the rlcr
    console to the terminal; ``path`` None: nothing is routed (``-v``). ``header``: the file's first line.
    ``interrupted()`` true when the block raises: the user pressed Ctrl-C (:mod:`rlcr.cli.interrupt` writes its
    own lines), so the descriptors stay routed and what the libraries print while stopping stays in the log."""
    if path is None:
        yield
        return
    from rlcr.ui.presentation import console

    for k, v in QUIET_ENV.items():
        os.environ.setdefault(k, v)
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    try:  # a command run in-process under a Python-level stdout (a test's runner): the console stays on it
        own = sys.stdout.fileno() == 1
    except (AttributeError, ValueError, OSError):
        own = False
    terminal = os.fdopen(os.dup(1), "w", buffering=1, encoding=getattr(sys.stdout, "encoding", None) or "utf-8",
                         errors="replace") if own else sys.stdout
    saved = os.dup(1), os.dup(2)
    with open(path, "ab") as log:
        if header:
            log.write(header.encode("utf-8", "replace") + b"\n")
            log.flush()
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    console.file = terminal
    try:
        yield
    except BaseException:
        if interrupted is None or not interrupted():
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
        raise
    finally:
        # the console goes back to sys.stdout (a command run in-process, e.g. by a test, must not keep writing to
        # the terminal it captured); on success the descriptors stay routed, for the shutdown lines at exit
        console.file = None
        if own:
            terminal.close()
        os.close(saved[0])
        os.close(saved[1])
