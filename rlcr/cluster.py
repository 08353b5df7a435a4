"""The Ray cluster a run uses: start-up, and what a run asks of it.

A run keeps its vLLM engine actors for the whole flow (they serve both rollout
stages, every iteration and the evaluations) while Ray Train's workers come and go
for each update, so the cluster must hold both at once. :func:`check_fits` compares
that demand with the cluster *before* any work and fails within seconds, naming
what was asked and what the cluster has: Ray itself would wait forever for
resources that never come.

Placement is configuration: ``engine_resources`` and ``trainer_resources`` add custom
Ray resources to what each engine actor and each Ray Train worker asks for (e.g.
``{"worker_node": 1}``, which only the nodes meant for them advertise), and the fit
check counts them, per node as well as in total. :func:`check_storage` refuses, right
after connecting, local paths that the other nodes of a multi-node cluster would not
see (``storage_uri``, ``model``) unless ``storage_shared`` says they do.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

from rlcr.config import ConfigError, RLCRConfig

__all__ = ["ensure_ray", "engine_actor_resources", "trainer_worker_resources", "ENGINE_ACTOR_CPUS", "STAGE_ACTOR_CPUS",
           "run_demand", "check_fits", "check_cluster_fits", "ResourceError", "check_storage", "StorageNotShared",
           "alive_nodes"]

ENGINE_ACTOR_CPUS = 0.5
"""Logical CPUs of one long-lived engine actor (it mostly waits; its threads use the node's cores)."""
STAGE_ACTOR_CPUS = 0.1
"""Logical CPUs of a Ray Data stage actor that sends its batches to a shared engine (and of the cheap steps)."""


class ResourceError(RuntimeError):
    """The cluster cannot hold what the run asks for; the message says what is missing."""


class StorageNotShared(ConfigError):
    """A local path of the run would not be the same files on every node of the cluster."""


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
    """Ray resources of one engine actor: its CPU share, GPUs with ``use_gpu``, and ``engine_resources``."""
    out = {"CPU": ENGINE_ACTOR_CPUS}
    if cfg.use_gpu:
        out["GPU"] = float(cfg.engine_tensor_parallel_size)
    out.update(cfg.engine_resources)
    return out


def trainer_worker_resources(cfg: RLCRConfig) -> dict[str, float]:
    """Ray resources of one Ray Train worker (Ray Train's defaults: 1 GPU, or 1 CPU) plus ``trainer_resources``:
    the trainer's ``ScalingConfig(resources_per_worker=…)``."""
    out = {"GPU": 1.0} if cfg.use_gpu else {"CPU": 1.0}
    out.update(cfg.trainer_resources)
    return out


def _asked_by(cfg: RLCRConfig, res: str) -> str:
    """The settings that make the run ask for resource ``res``."""
    fields = []
    if res in cfg.engine_resources:
        fields.append("engine_resources")
    if res in cfg.trainer_resources:
        fields.append("trainer_resources")
    if res == "CPU":
        fields.append("rollout_actors, num_workers")
    if res == "GPU":
        fields.append("use_gpu, engine_tensor_parallel_size, num_workers")
    return ", ".join(fields) or "rollout_actors, num_workers"


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


def check_fits(cfg: RLCRConfig, cluster: Mapping[str, float],
               nodes: Sequence[Mapping[str, float]] | None = None) -> None:
    """Raise :class:`ResourceError` unless every phase of the run fits in ``cluster`` (Ray's resource totals)
    and, given ``nodes`` (each alive node's resources), one engine actor and one trainer worker each fit on
    some single node (a custom resource on one node and the GPUs on another add up in the totals only)."""
    problems = []
    for phase, need in run_demand(cfg).items():
        for res, amount in sorted(need.items()):
            have = float(cluster.get(res, 0.0))
            if amount > have + 1e-9:
                why = f" ({_asked_by(cfg, res)})"
                if have == 0 and res not in ("CPU", "GPU"):
                    why = f" ({_asked_by(cfg, res)}; no node advertises {res!r}: ray start --resources)"
                problems.append(f"the {phase} phase needs {amount:g} {res} but the cluster has {have:g}{why}")
    engines = engine_actor_resources(cfg)
    worker = trainer_worker_resources(cfg)
    if nodes is not None and not problems:
        for what, one in (("an engine actor", engines), ("a trainer worker", worker)):
            if not any(all(amount <= float(node.get(res, 0.0)) + 1e-9 for res, amount in one.items())
                       for node in nodes):
                problems.append(f"no single node has all of {what}'s {one} (each node: "
                                f"{[{k: v for k, v in n.items() if k in one} for n in nodes]})")
    if problems:
        raise ResourceError(
            "the run does not fit in the Ray cluster: " + "; ".join(problems) + ". Asked: "
            f"{cfg.rollout_actors} engine actor(s) × {engines} kept for the whole run (rollout_actors, "
            f"engine_tensor_parallel_size, engine_resources) plus {cfg.num_workers} trainer worker(s) × {worker} "
            f"during each update (num_workers, use_gpu, trainer_resources). Lower num_workers or rollout_actors, "
            f"or add nodes.")


def alive_nodes() -> list[dict[str, Any]]:
    """The connected cluster's alive nodes (``ray.nodes()`` entries)."""
    import ray

    return [n for n in ray.nodes() if n.get("Alive")]


def check_cluster_fits(cfg: RLCRConfig) -> None:
    """:func:`check_fits` against the connected cluster's total resources and its alive nodes'."""
    import ray

    check_fits(cfg, ray.cluster_resources(), [n.get("Resources", {}) for n in alive_nodes()])


def _is_local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


def check_storage(cfg: RLCRConfig, nodes: Sequence[Mapping[str, Any]] | None = None) -> None:
    """Refuse local paths that a multi-node cluster cannot share; call it right after :func:`ensure_ray`.

    On a cluster of more than one alive node (``nodes``: ``ray.nodes()`` entries, default the connected
    cluster's), a local ``storage_uri`` would put each node's checkpoints on its own disk, and a local
    ``model`` (a path, or a name such as ``smollm2-135m-instruct`` that resolves into the driver's cache)
    would not exist on the nodes that run the engines and the trainer. Both are refused with
    :class:`StorageNotShared` unless ``storage_shared`` declares them the same files on every node (an NFS
    mount; a model baked into the image at that path). ``s3://`` needs no such declaration.
    """
    if cfg.storage_shared:
        return
    local = [(name, getattr(cfg, name)) for name in ("storage_uri", "model") if _is_local(getattr(cfg, name))]
    if not local:
        return
    if nodes is None:
        nodes = alive_nodes()
    n = sum(1 for node in nodes if node.get("Alive", node.get("alive", False)))
    if n <= 1:
        return
    what = " and ".join(f"{name} {value!r}" for name, value in local)
    raise StorageNotShared(
        f"{what}: a local path on a Ray cluster of {n} alive nodes; the engines and trainer workers on the other "
        f"nodes would read and write their own disks, not this one. Use s3:// (storage_uri=s3://bucket/prefix, "
        f"model=s3://… a sealed checkpoint, s3_endpoint_url for an S3-compatible server), or set "
        f"storage_shared=true if the path is the same filesystem on every node (e.g. an NFS mount).")
