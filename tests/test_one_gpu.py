"""Issue 48 item 4: the one-GPU recipe (configs/gpu-1.yaml), checked statically: it loads, the run asks Ray for
one GPU in all in every phase, and the engine's memory share leaves the trainer most of the device."""

from pathlib import Path

from rlcr.config import load_config
from rlcr.runs.cluster import check_fits, engine_actor_resources, run_demand, trainer_worker_resources

ROOT = Path(__file__).resolve().parents[1]


def test_one_gpu_config_asks_for_one_gpu_in_all():
    cfg = load_config(str(ROOT / "configs/gpu-1.yaml"), [])
    assert cfg.update.use_gpu and cfg.update.num_workers == 1 and cfg.rollout.actors == 1
    demand = run_demand(cfg)
    assert {phase: d.get("GPU") for phase, d in demand.items()} == {"rollouts": 1.0, "update": 1.0}
    assert engine_actor_resources(cfg)["GPU"] + trainer_worker_resources(cfg)["GPU"] == 1.0
    check_fits(cfg, {"CPU": 16.0, "GPU": 1.0})  # one GPU machine: fits
    assert cfg.engine.gpu_memory_utilization <= 0.5  # the trainer keeps at least half the device's memory


def test_the_two_gpu_config_does_not_fit_one_gpu():
    import pytest

    from rlcr.runs.cluster import ResourceError

    cfg = load_config(str(ROOT / "configs/gpu.yaml"), [])
    assert run_demand(cfg)["rollouts"]["GPU"] == 2.0
    with pytest.raises(ResourceError):
        check_fits(cfg, {"CPU": 16.0, "GPU": 1.0})
