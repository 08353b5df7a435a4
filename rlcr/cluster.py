"""The Ray cluster a run uses: start-up, and what a run asks of it.

A run keeps its vLLM engine actors for the whole flow (they serve both rollout
stages, every iteration and the evaluations) while Ray Train's workers come and go
for each update, so the cluster must hold both at once. :func:`check_fits` compares
that demand with the cluster *before* any work and fails within seconds, naming
what was asked and what the cluster has: Ray itself would wait forever for
resources that never come.
"""

from __future__ import annotations

import os
from typing import Mapping

from rlcr.config import RLCRConfig

__all__ = ["ensure_ray", "engine_actor_resources", "trainer_worker_resources", "ENGINE_ACTOR_CPUS", "STAGE_ACTOR_CPUS",
           "run_demand", "check_fits", "check_cluster_fits", "ResourceError"]

ENGINE_ACTOR_CPUS = 0.5
"""Logical CPUs of one long-lived engine actor (it mostly waits; its threads use the node's cores)."""
STAGE_ACTOR_CPUS = 0.1
"""Logical CPUs of a Ray Data stage actor that sends its batches to a shared engine (and of the cheap steps)."""


class ResourceError(RuntimeError):
    """The cluster cannot hold what the run asks for; the message says what is missing."""


def ensure_ray() -> None:
    """Connect to the cluster at ``RAY_ADDRESS``, or start a local Ray."""
    import ray

    if ray.is_initialized():
        return
    ray.init(
        address=os.environ.get("RAY_ADDRESS") or None,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}},
    )


def engine_actor_resources(cfg: RLCRConfig) -> dict[str, float]:
    """Ray resources of one engine actor."""
    out = {"CPU": ENGINE_ACTOR_CPUS}
    if cfg.use_gpu:
        out["GPU"] = float(cfg.engine_tensor_parallel_size)
    return out


def trainer_worker_resources(cfg: RLCRConfig) -> dict[str, float]:
    """Ray resources of one Ray Train worker (Ray Train's defaults: 1 GPU, or 1 CPU)."""
    return {"GPU": 1.0} if cfg.use_gpu else {"CPU": 1.0}


def _add(a: dict[str, float], b: Mapping[str, float], times: float = 1.0) -> dict[str, float]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0.0) + v * times
    return out


def run_demand(cfg: RLCRConfig) -> dict[str, dict[str, float]]:
    """What a run holds at once in each phase: the engines stay up through both.

    ``rollouts``: engines + two stages of ``rollout_actors`` stage actors + one cheap step;
    ``update``: engines + ``num_workers`` trainer workers.
    """
    engines = _add({}, engine_actor_resources(cfg), cfg.rollout_actors)
    rollouts = _add(engines, {"CPU": STAGE_ACTOR_CPUS}, 2 * cfg.rollout_actors + 1)
    update = _add(engines, trainer_worker_resources(cfg), cfg.num_workers)
    return {"rollouts": rollouts, "update": update}


def check_fits(cfg: RLCRConfig, cluster: Mapping[str, float]) -> None:
    """Raise :class:`ResourceError` unless every phase of the run fits in ``cluster`` (Ray's resource totals)."""
    problems = []
    for phase, need in run_demand(cfg).items():
        for res, amount in sorted(need.items()):
            have = float(cluster.get(res, 0.0))
            if amount > have + 1e-9:
                problems.append(f"the {phase} phase needs {amount:g} {res} but the cluster has {have:g}")
    if problems:
        engines = engine_actor_resources(cfg)
        worker = trainer_worker_resources(cfg)
        raise ResourceError(
            "the run does not fit in the Ray cluster: " + "; ".join(problems) + ". Asked: "
            f"{cfg.rollout_actors} engine actor(s) × {engines} kept for the whole run (rollout_actors, "
            f"engine_tensor_parallel_size) plus {cfg.num_workers} trainer worker(s) × {worker} during each "
            f"update (num_workers, use_gpu). Lower num_workers or rollout_actors, or add nodes.")


def check_cluster_fits(cfg: RLCRConfig) -> None:
    """:func:`check_fits` against the connected cluster's total resources."""
    import ray

    check_fits(cfg, ray.cluster_resources())
