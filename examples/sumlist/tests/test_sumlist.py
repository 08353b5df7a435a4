"""The sumlist task's own tests: run with `pytest examples/sumlist/tests` once the package is installed."""

import pytest

from rlcr.config import ConfigError, RLCRConfig
from rlcr.tasks.registry import get_task


def test_the_task_is_found_by_its_entry_point_and_scores_answers():
    task = get_task("sumlist")
    assert task.score("<answer>6</answer>", [1, 2, 3], format_score=0.1) == 1.0
    assert task.score("<answer>7</answer>", [1, 2, 3], format_score=0.1) == 0.1
    assert task.score("no answer", [1, 2, 3], format_score=0.1) == 0.0
    with task.scoring(2) as stats:
        assert task.accuracy("<answer> 6.0 </answer>", [1, 2, 3]) == 1.0
    assert stats.timeouts == 0


def test_its_options_are_validated_and_drive_generation():
    cfg = RLCRConfig(tasks={"name": "sumlist", "options": {"min_len": 3, "max_len": 3}})
    assert cfg.tasks.options == {"min_len": 3, "max_len": 3, "max_value": 20}
    task = get_task("sumlist")
    assert {len(p) for p in task.generate(20, seed=1, cfg=cfg)} == {3}
    assert task.strata(cfg) == [3]
    with pytest.raises(ConfigError, match="did you mean 'tasks.options.max_len'"):
        RLCRConfig.from_dict({"tasks": {"name": "sumlist", "options": {"max_lne": 3}}})
    with pytest.raises(ConfigError, match="min_len must be <= tasks.options.max_len"):
        RLCRConfig.from_dict({"tasks": {"name": "sumlist", "options": {"min_len": 5, "max_len": 3}}})
