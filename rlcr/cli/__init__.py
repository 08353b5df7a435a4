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

import rlcr.cli.run  # noqa: F401, I001 — registers the commands on `app`, in the order --help lists them
import rlcr.cli.evaluation  # noqa: F401
import rlcr.cli.demo  # noqa: F401
import rlcr.cli.runs  # noqa: F401
import rlcr.cli.export  # noqa: F401
from rlcr.cli.app import UserError, app
from rlcr.ui.progress import StageProgress, committed_figures

__all__ = ["app", "main", "UserError", "StageProgress", "committed_figures"]


def main() -> None:
    app()
