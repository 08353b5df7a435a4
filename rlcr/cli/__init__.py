"""``rlcr`` command line: the same flows as the deployments, with progress and a summary.

    rlcr models prepare                      # SmolLM2-135M-Instruct GGUF → safetensors (cached)
    rlcr sft   --config configs/demo.yaml    # format warm-start on solver traces
    rlcr train --config configs/demo.yaml --run-id demo [section.field=value ...]
    rlcr eval  --config configs/demo.yaml --checkpoint demo@latest   # RUN@ITERATION, or a URI
    rlcr compare <run A> <run B>             # paired held-out comparison (runs or `rlcr eval --records` files)
    rlcr probe --config configs/demo.yaml --run-id demo
    rlcr demo                                # SmolLM2 → warm-start → RLCR → probe, with a summary
    rlcr runs [show RUN]                     # a store's runs (state, checkpoints), one run's iterations
    rlcr config show [--config F] [section.field=value ...] [--json]
                                             # every field: value, source, effect, documentation

A user error (a wrong option or field, a run or bucket that is not there) is one line on stderr and exit
code 2, before Ray or Prefect start wherever the input alone shows it; ``rlcr --debug`` adds the traceback.

The package: :mod:`~rlcr.cli.app` (the command group and its user errors), :mod:`~rlcr.cli.inputs` (the checks
every command makes first), the commands by group (:mod:`~rlcr.cli.run`: models, config, train, sft;
:mod:`~rlcr.cli.evaluation`: eval, compare, probe; :mod:`~rlcr.cli.demo`). Tables are :mod:`rlcr.ui.presentation`'s,
progress displays :mod:`rlcr.ui.progress`'s.
"""

import sys  # noqa: I001 — the commands register on `app` in the order --help lists them (below)
from typing import NoReturn

import rlcr.cli.run  # noqa: F401
import rlcr.cli.evaluation  # noqa: F401
import rlcr.cli.demo  # noqa: F401
import rlcr.cli.runs  # noqa: F401
import rlcr.cli.export  # noqa: F401
from rlcr.cli.app import UserError, app
from rlcr.ui.progress import StageProgress, committed_figures

__all__ = ["app", "main", "end_process", "UserError", "StageProgress", "committed_figures"]


def main() -> None:
    """The ``rlcr`` command (its console script and ``python -m rlcr.cli``): :data:`app`, then :func:`end_process`."""
    try:
        app()  # click's standalone mode ends with SystemExit, whatever the outcome
    except SystemExit as e:
        end_process(e.code)


def end_process(code: int | str | None) -> NoReturn:
    """End the process as the interpreter would, minus its final teardown: wait for the non-daemon threads, run the
    exit handlers (Ray's shutdown, Prefect's temporary server, MLflow and W&B, logging's flush), flush stdout and
    stderr, then ``os._exit``. With torch, vLLM and Ray's core loaded, the teardown that is skipped (freeing every
    module and extension) took 3–4 s after the command's last line on the CI machine, and it writes nothing.
    ``code`` as ``SystemExit``'s: None is 0, a string is printed to stderr and is 1."""
    import atexit
    import os
    import threading

    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:
        print(code, file=sys.stderr)
        status = 1
    for thread in threading.enumerate():  # what the interpreter does first at exit
        if thread is not threading.current_thread() and not thread.daemon and thread.is_alive():
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a pipe whose reader is gone
            pass
    os._exit(status & 0xFF)  # what the OS keeps of an exit status, as for sys.exit
