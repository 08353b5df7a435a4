"""Held-out evaluation, paired comparisons, recalibration baselines and the protocols' statistics
(docs/architecture.md)."""
