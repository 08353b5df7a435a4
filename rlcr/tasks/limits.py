"""Limits shared by a task's loader, its scorer and the config's task ranges (one constant, one place).

Pure constants, importing nothing: the config validates its task ranges against them (and validates its
``task`` against the registry, which imports the tasks) and the Countdown module scores and loads with them,
without an import cycle.
"""

MAX_LITERAL_DIGITS = 12
"""Integer literals longer than this cannot be one of a task's numbers: the scorer refuses them, and the
task loader refuses a task whose numbers or target are longer, so every task it accepts can be solved."""
MAX_TASK_NUMBER = 10**MAX_LITERAL_DIGITS - 1
"""Largest number (and largest target in absolute value) of a task: the longest literal the scorer reads."""
DEFAULT_FORMAT_SCORE = 0.1
"""The default ``format_score`` (``RLCRConfig.format_score`` and Countdown's ``compute_score``): the score of an
extracted but wrong answer."""
