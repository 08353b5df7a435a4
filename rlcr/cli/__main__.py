"""``python -m rlcr.cli``: the ``rlcr`` command."""

from rlcr.cli import main

main()
