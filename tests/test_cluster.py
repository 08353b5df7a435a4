"""What a run asks of its Ray cluster (``rlcr/runs/cluster.py``): the demand the fit check compares with the cluster,
proven on a real Ray of a shape where under-counting it would hang the run, and the local Ray ``ensure_ray``
starts (its worker soft limit).

The cluster tests each start their own Ray in a subprocess (``ray.init`` of a given shape, or ``ensure_ray``),
under a short temp dir of their own (``RAY_TMPDIR``), so they neither join nor disturb the session's Ray.
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from rlcr.config import RLCRConfig
from rlcr.runs.cluster import (
    STAGE_ACTOR_CPUS,
    WORKER_SOFT_LIMIT,
    WORKER_SOFT_LIMIT_ENV,
    ResourceError,
    check_fits,
    engine_actor_resources,
    run_demand,
    trainer_worker_resources,
)

ROOT = Path(__file__).resolve().parents[1]

# Two engines (0.5 CPU each) and one trainer worker (1 CPU) on a 2-CPU cluster: engines + trainer exactly fill
# it, so the rollouts' Ray Data tasks (0.1 CPU each) can never be scheduled while the trainer holds its worker.
SHAPE = {"rollout.actors": 2, "update.num_workers": 1}
SHAPE_CPUS = 2


def _old_phases(cfg: RLCRConfig) -> dict[str, dict[str, float]]:
    """The demand as the check counted it before the trainer was long-lived: rollouts = engines + stage tasks,
    update = engines + trainer workers (the workers assumed gone while the rollouts run)."""
    engines = {k: v * cfg.rollout.actors for k, v in engine_actor_resources(cfg).items()}
    rollouts = dict(engines, CPU=engines["CPU"] + STAGE_ACTOR_CPUS * (2 * cfg.rollout.actors + 1))
    update = dict(engines)
    for k, v in trainer_worker_resources(cfg).items():
        update[k] = update.get(k, 0.0) + v * cfg.update.num_workers
    return {"rollouts": rollouts, "update": update}


# ----------------------------------------------------------------------------- units (no Ray)


def test_the_trainer_workers_count_in_every_phase():
    cfg = RLCRConfig.from_dict({**SHAPE, "placement": {"trainer_resources": {"trainer_node": 1},
                                                       "engine_resources": {"engine_node": 1}}})
    demand = run_demand(cfg)
    # rollouts: 2 engines × 0.5 + 1 worker × 1 + (2 × 2 + 1) stage tasks × 0.1
    assert demand["rollouts"] == pytest.approx({"CPU": 2.5, "engine_node": 2.0, "trainer_node": 1.0})
    assert demand["update"] == pytest.approx({"CPU": 2.0, "engine_node": 2.0, "trainer_node": 1.0})
    released = run_demand(cfg.model_copy(update={"engine.release_during_update": True}))
    assert released["update"] == pytest.approx({"CPU": 1.0, "trainer_node": 1.0})  # only the engines go
    assert released["rollouts"] == demand["rollouts"]  # they are back (and the trainer still there) for rollouts
    gpu = run_demand(RLCRConfig(update={"use_gpu": True, "num_workers": 2}, rollout={"actors": 1},
                                engine={"release_during_update": True}))
    assert gpu["rollouts"]["GPU"] == 3.0 and gpu["update"] == {"GPU": 2.0}


def test_the_shape_the_old_check_passed_is_refused_in_one_line():
    cfg = RLCRConfig.from_dict(SHAPE)
    cluster = {"CPU": float(SHAPE_CPUS)}
    for need in _old_phases(cfg).values():  # what the check used to compare: both phases "fit"
        assert all(amount <= cluster.get(res, 0.0) for res, amount in need.items())
    with pytest.raises(ResourceError) as e:
        check_fits(cfg, cluster, [cluster])
    msg = str(e.value)
    assert "\n" not in msg
    assert "the rollouts phase needs 2.5 CPU but the cluster has 2 (rollout.actors, update.num_workers)" in msg
    assert "update phase" not in msg  # engines + trainer alone do fit
    assert "trainer worker(s) × {'CPU': 1.0} also kept for the whole run" in msg
    check_fits(cfg, {"CPU": 3.0}, [{"CPU": 3.0}])
    check_fits(cfg.model_copy(update={"update.num_workers": 2}), {"CPU": 3.5})  # 1 + 2 + 0.5 exactly


# ----------------------------------------------------------------------------- a real Ray of that shape

SHAPE_SCRIPT = r"""
import json, sys, time
import ray
from rlcr.runs.cluster import (ENGINE_ACTOR_CPUS, STAGE_ACTOR_CPUS, ResourceError, check_cluster_fits,
                               engine_actor_resources)
from rlcr.config import RLCRConfig
from rlcr.train.trainer import PolicyTrainer

model, storage, shape, cpus = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
out = {}
ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False,
         runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}})
cfg = RLCRConfig.from_dict({"model.name": model, "storage.uri": storage, **shape})
try:
    check_cluster_fits(cfg)
    out["check"] = None
except ResourceError as e:
    out["check"] = str(e)

# What the run would hold if started anyway. The engines: actors that ask exactly what EnginePool's engine actors
# ask (engine_actor_resources; vLLM itself is not needed to hold a CPU share). The trainer: the real one.
@ray.remote
class Engine:
    def ready(self):
        return True

res = engine_actor_resources(cfg)
engines = [Engine.options(num_cpus=res["CPU"]).remote() for _ in range(cfg.rollout.actors)]
ray.get([e.ready.remote() for e in engines], timeout=120)
trainer = PolicyTrainer(cfg, policy_uri=model)
time.sleep(2)
out["available_with_trainer"] = ray.available_resources().get("CPU", 0.0)

@ray.remote(num_cpus=STAGE_ACTOR_CPUS)
def stage_task():  # what each rollout stage's Ray Data task asks (rlcr/rollout/pipeline.py)
    return True

pending = stage_task.remote()
ready, _ = ray.wait([pending], timeout=10)
out["stage_ran_with_trainer"] = bool(ready)
t0 = time.monotonic()
trainer.close()
ready, _ = ray.wait([pending], timeout=60)
out["stage_ran_after_trainer_closed"] = bool(ready)
out["stage_wait_after_close_s"] = round(time.monotonic() - t0, 1)
print("RESULT " + json.dumps(out))
ray.shutdown()
"""


def _ray_env(tmp: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", WORKER_SOFT_LIMIT_ENV)}
    env.update(PYTHONPATH=str(ROOT), RAY_TMPDIR=tmp, RLCR_RAY_DASHBOARD="0", RAY_USAGE_STATS_ENABLED="0", **extra)
    return env


def _result(proc: subprocess.CompletedProcess) -> dict:
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.slow
def test_a_cluster_the_old_check_passed_hangs_the_rollouts_and_is_refused(tiny_model_dir, tmp_path):
    """On a real 2-CPU Ray, the engines' shares and the real long-lived trainer (Ray Train, 1 worker) take every
    CPU: a rollout stage task then waits for as long as the trainer lives (10 s here; the run would hang), and
    runs once the trainer is closed. The fit check refuses this shape before anything starts."""
    with tempfile.TemporaryDirectory(prefix="rlcr-ray-", dir="/tmp") as tmp:  # short: Ray's socket paths
        proc = subprocess.run([sys.executable, "-c", SHAPE_SCRIPT, str(tiny_model_dir), str(tmp_path / "store"),
                               json.dumps(SHAPE), str(SHAPE_CPUS)],
                              env=_ray_env(tmp), capture_output=True, text=True, timeout=600, cwd=tmp_path)
    out = _result(proc)
    assert out["check"] and "the rollouts phase needs 2.5 CPU but the cluster has 2" in out["check"]
    assert out["available_with_trainer"] == pytest.approx(0.0)  # the trainer holds exactly its worker's CPU
    assert out["stage_ran_with_trainer"] is False, out
    assert out["stage_ran_after_trainer_closed"] is True, out


# ----------------------------------------------------------------------------- the local Ray's worker soft limit

SOFT_LIMIT_SCRIPT = r"""
import json, os
import ray
from rlcr.runs.cluster import WORKER_SOFT_LIMIT_ENV, ensure_ray

ensure_ray()

@ray.remote(num_cpus=0.1)
def worker_env():
    return os.environ.get(WORKER_SOFT_LIMIT_ENV)

node = ray._private.worker._global_node  # the raylet this process started: the process that reads the setting
raylet = node.all_processes["raylet"][0].process.pid
with open(f"/proc/{raylet}/environ", "rb") as f:
    raylet_env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
value = raylet_env.get(WORKER_SOFT_LIMIT_ENV.encode())
print("RESULT " + json.dumps({"worker": ray.get(worker_env.remote()), "raylet": value and value.decode()}))
ray.shutdown()
"""


@pytest.mark.slow
def test_the_local_ray_keeps_its_idle_workers_unless_the_user_said_otherwise(tmp_path):
    """``ensure_ray`` starts its local Ray with ``RAY_num_workers_soft_limit=64`` (seen by the raylet, which
    reads it, and by a worker); a value already in the environment is the user's and is kept."""
    runs = {}
    for name, extra in (("default", {}), ("user", {WORKER_SOFT_LIMIT_ENV: "7"})):
        with tempfile.TemporaryDirectory(prefix="rlcr-ray-", dir="/tmp") as tmp:
            proc = subprocess.run([sys.executable, "-c", SOFT_LIMIT_SCRIPT], env=_ray_env(tmp, **extra),
                                  capture_output=True, text=True, timeout=300, cwd=tmp_path)
        runs[name] = _result(proc)
    assert runs["default"] == {"worker": str(WORKER_SOFT_LIMIT), "raylet": str(WORKER_SOFT_LIMIT)}
    assert runs["user"] == {"worker": "7", "raylet": "7"}
