"""The Ray cluster a run uses: start-up, and what a run asks of it.

A run keeps its vLLM engine actors for the whole flow (they serve both rollout
stages, every iteration and the evaluations) and its Ray Train workers too
(:class:`rlcr.train.trainer.PolicyTrainer` starts them once; they keep their
resources while the rollouts run), so the cluster must hold the engines, the
trainer workers *and* the rollouts' Ray Data stage tasks at once;
``engine.release_during_update`` frees only the engines, only during the update.
:func:`check_fits` compares that demand with the cluster *before* any work and
fails within seconds, naming what was asked and what the cluster has: Ray itself
would wait forever for resources that never come.

Placement is configuration: ``placement.engine_resources`` and ``placement.trainer_resources`` add custom
Ray resources to what each engine actor and each Ray Train worker asks for (e.g.
``{"worker_node": 1}``, which only the nodes meant for them advertise), and the fit
check counts them, per node as well as in total. :func:`check_storage` refuses, right
after connecting, local paths that the other nodes of a multi-node cluster would not
see (``storage.uri``, ``model``) unless ``placement.storage_shared`` says they do.

Before any of that, :func:`check_storage_reachable` asks the run's storage itself, within a bounded time
and without writing: a local directory that can be created or written, an ``s3://`` bucket that exists
at a reachable endpoint with credentials it accepts. The CLI calls it before Ray or Prefect start.

A local Ray starts its dashboard when ``ray[default]``'s dashboard packages are installed
(:func:`ray_dashboard`; ``RLCR_RAY_DASHBOARD=0`` turns it off, ``=1`` insists on it).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
from pathlib import Path
from typing import Any, Mapping, Sequence

from rlcr.config import ConfigError, RLCRConfig

__all__ = ["ensure_ray", "engine_actor_resources", "trainer_worker_resources", "ENGINE_ACTOR_CPUS", "STAGE_ACTOR_CPUS",
           "run_demand", "check_fits", "check_cluster_fits", "ResourceError", "check_storage", "StorageNotShared",
           "alive_nodes", "StorageUnreachable", "check_storage_reachable", "storage_problem", "ray_dashboard",
           "DASHBOARD_ENV", "ray_log_dir", "WORKER_SOFT_LIMIT", "WORKER_SOFT_LIMIT_ENV", "pin_to_cpus",
           "KEEP_MEMORY_ENV", "trainer_runtime_env"]

ENGINE_ACTOR_CPUS = 0.5
"""Logical CPUs of one long-lived engine actor (it mostly waits; its threads use the node's cores)."""
STAGE_ACTOR_CPUS = 0.1
"""Logical CPUs of a Ray Data stage actor that sends its batches to a shared engine (and of the cheap steps)."""


KEEP_MEMORY_ENV = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 46)}
"""glibc's allocator settings of a trainer worker with ``placement.trainer_keeps_memory``, read when its process
starts: one arena (the training thread's large tensors come from the main heap, not from mmap, which a non-main
arena falls back to), no mmap for any size, and a trim threshold of 64 TiB, so freed memory stays in the
process and the next update reuses it without faulting pages in again."""


def trainer_runtime_env(cfg: RLCRConfig) -> dict[str, Any]:
    """The Ray Train workers' own runtime environment (``RunConfig(worker_runtime_env=…)``): the environment
    variables of :data:`KEEP_MEMORY_ENV` with ``placement.trainer_keeps_memory``, else nothing."""
    return {"env_vars": dict(KEEP_MEMORY_ENV)} if cfg.placement.trainer_keeps_memory else {}


def pin_to_cpus(cpus: Sequence[int] | None, what: str) -> int | None:
    """Pin every thread of this process to the logical CPUs ``cpus`` (``placement.engine_cpus`` /
    ``placement.trainer_cpus``; threads started later inherit it) and size torch's thread pool to their number;
    returns it (None: ``cpus`` is None, nothing done). A CPU this process may not use is a ConfigError naming
    ``what``. Linux only (``sched_setaffinity``)."""
    if not cpus:
        return None
    if not hasattr(os, "sched_setaffinity"):
        raise ConfigError(f"{what}: pinning to CPUs needs Linux (os.sched_setaffinity)")
    allowed = os.sched_getaffinity(0)
    missing = sorted(set(cpus) - allowed)
    if missing:
        raise ConfigError(f"{what}: CPU(s) {missing} are not among this node's usable CPUs {sorted(allowed)}")
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (ProcessLookupError, OSError):  # a thread that ended meanwhile
            continue
    import torch

    os.environ["OMP_NUM_THREADS"] = str(len(cpus))
    torch.set_num_threads(len(cpus))
    return len(cpus)


class ResourceError(RuntimeError):
    """The cluster cannot hold what the run asks for; the message says what is missing."""


class StorageNotShared(ConfigError):
    """A local path of the run would not be the same files on every node of the cluster."""


class StorageUnreachable(ConfigError):
    """The run's storage cannot be used as configured (no credentials, no such bucket, no answer, not writable)."""


DASHBOARD_ENV = "RLCR_RAY_DASHBOARD"
"""``1``: a local Ray starts its dashboard (an error without its packages); ``0``: it does not; unset or
``auto``: it does when ``ray[default]``'s dashboard packages are installed."""
_DASHBOARD_MODULES = ("aiohttp", "aiohttp_cors", "grpc", "opencensus", "opentelemetry",
                      "opentelemetry.exporter.prometheus", "opentelemetry.proto", "prometheus_client")
"""What ``ray.dashboard.optional_deps`` imports (Ray 2.60): without them Ray cannot serve its dashboard."""


def _missing_dashboard_modules() -> list[str]:
    missing = []
    for name in _DASHBOARD_MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a parent package is missing
            found = False
        if not found:
            missing.append(name)
    return missing


def ray_dashboard() -> tuple[bool, str]:
    """Whether a local Ray should start its dashboard, and why (for the log-locations line): ``$RLCR_RAY_DASHBOARD``
    (``1``/``0``), else whether the dashboard's packages (``pip install 'ray[default]'``) are installed.
    ``RLCR_RAY_DASHBOARD=1`` without them is a :class:`~rlcr.config.ConfigError`. Imports nothing."""
    setting = os.environ.get(DASHBOARD_ENV, "auto").strip().lower() or "auto"
    if setting in ("0", "false", "no", "off"):
        return False, f"{DASHBOARD_ENV}={setting}"
    if setting not in ("1", "true", "yes", "on", "auto"):
        raise ConfigError(f"{DASHBOARD_ENV}={setting!r}: expected 1, 0 or auto")
    missing = _missing_dashboard_modules()
    if missing and setting != "auto":
        raise ConfigError(f"{DASHBOARD_ENV}={setting}: the Ray dashboard needs ray[default] (missing: "
                          f"{', '.join(missing)}); pip install 'ray[default]', or unset {DASHBOARD_ENV}")
    if missing:
        return False, f"needs ray[default]: missing {', '.join(missing[:3])}"
    return True, f"{DASHBOARD_ENV}={setting}" if setting != "auto" else "ray[default] installed"


WORKER_SOFT_LIMIT_ENV = "RAY_num_workers_soft_limit"
WORKER_SOFT_LIMIT = 64
"""Idle Ray workers a local Ray keeps (``$RAY_num_workers_soft_limit``, set by :func:`ensure_ray` unless already
set). Ray's default is the node's CPU count: with the engines, the trainer workers and Ray Train's and Ray Data's
own actors already above it, the raylet kills each idle worker after a second and every Ray Data task of the
next stage starts a new Python process. Measured on the demo (2 cores): the Ray Data stages' overhead fell from
2.79 s to 0.20 s per iteration (docs/iteration-overhead.md). A cluster started with ``ray start`` reads it from
``ray start``'s own environment (docs/deployments.md)."""


def ray_log_dir() -> str:
    """Where a local Ray writes its logs (the newest session's): Ray's own rule for its temp dir."""
    base = os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp"
    return str(Path(base) / "ray" / "session_latest" / "logs")


def task_runtime_env(cfg: RLCRConfig | None, *, ship: bool) -> dict[str, Any]:
    """The Ray runtime environment's part for a task from outside rlcr (docs/tasks.md): ``$RLCR_TASK_MODULES``
    names its module, which every worker imports before it looks the task up; with ``ship`` (a cluster of
    other machines) ``py_modules`` carries the module's code (its top-level package, or its ``.py`` file).
    Empty for the built-in tasks."""
    from rlcr.tasks.registry import MODULES_ENV, plugin_modules

    modules = plugin_modules(cfg.tasks.name) if cfg is not None else []
    if not modules:
        return {}
    out: dict[str, Any] = {"env_vars": {MODULES_ENV: ",".join(modules)}}
    if ship:
        out["py_modules"] = [_module_code(modules[0].split("=", 1)[1].split(":")[0])]
    return out


def _module_code(module: str) -> str:
    """The path that carries the code of the imported module ``module`` to other nodes: its top-level package's
    directory, its file for a top-level module, or, for a namespace package (no ``__init__.py``, no
    ``__file__``), the directory of the portion that holds ``module``'s file. One-line ValueError otherwise."""
    top_name = module.split(".")[0]
    top = sys.modules.get(top_name)
    origin = getattr(top, "__file__", None)
    if origin:
        origin_path = Path(origin)
        return str(origin_path.parent if origin_path.name == "__init__.py" else origin_path)
    own = getattr(sys.modules.get(module), "__file__", None)
    for portion in getattr(top, "__path__", None) or []:
        if own and Path(own).resolve().is_relative_to(Path(portion).resolve()):
            return str(portion)
    raise ValueError(f"task module {module!r}: no file or directory holds its code, so it cannot be carried to the "
                     "cluster's nodes; install it on every node, or make it a package or a .py file")


def ensure_ray(cfg: RLCRConfig | None = None) -> str | None:
    """Connect to the cluster at ``RAY_ADDRESS``, or start a local Ray (with its dashboard where
    :func:`ray_dashboard` says so, and :data:`WORKER_SOFT_LIMIT` idle workers kept unless
    ``$RAY_num_workers_soft_limit`` says otherwise). Returns the dashboard's address when this call started one.
    With ``cfg``, a task from outside rlcr reaches every worker (:func:`task_runtime_env`)."""
    import ray

    if ray.is_initialized():
        return None
    address = os.environ.get("RAY_ADDRESS") or None
    dashboard = ray_dashboard()[0] if address is None else False
    if address is None:  # read by the raylet this ray.init starts (and inherited by its workers)
        os.environ.setdefault(WORKER_SOFT_LIMIT_ENV, str(WORKER_SOFT_LIMIT))
    runtime_env = task_runtime_env(cfg, ship=address is not None)
    runtime_env["env_vars"] = {"TOKENIZERS_PARALLELISM": "false", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                               **runtime_env.get("env_vars", {})}
    context = ray.init(address=address, include_dashboard=dashboard, log_to_driver=False, runtime_env=runtime_env)
    if not dashboard:
        return None
    return getattr(context, "dashboard_url", None) or None


def engine_actor_resources(cfg: RLCRConfig) -> dict[str, float]:
    """Ray resources of one engine actor: its CPU share, GPUs with ``use_gpu``, and ``placement.engine_resources``."""
    out = {"CPU": ENGINE_ACTOR_CPUS}
    if cfg.update.use_gpu:
        gpus = cfg.placement.engine_gpus
        out["GPU"] = float(cfg.engine.tensor_parallel_size if gpus is None else gpus)
    out.update(cfg.placement.engine_resources)
    return out


def engines_start_beside_trainer(cfg: RLCRConfig) -> bool:
    """Whether a run's engines may load while its trainer starts (tens of seconds each on a CPU, side by side
    instead of one after the other). Not with ``update.use_gpu``: vLLM sizes its KV cache from the device's free
    memory as it starts, and a trainer loading onto the same device meanwhile would change that."""
    return not cfg.update.use_gpu


def trainer_worker_resources(cfg: RLCRConfig) -> dict[str, float]:
    """Ray resources of one Ray Train worker (Ray Train's defaults: 1 GPU, or 1 CPU) plus
    ``placement.trainer_resources``: the trainer's ``ScalingConfig(resources_per_worker=…)``."""
    out = {"GPU": float(cfg.placement.trainer_gpus or 1.0)} if cfg.update.use_gpu else {"CPU": 1.0}
    out.update(cfg.placement.trainer_resources)
    return out


def _asked_by(cfg: RLCRConfig, res: str) -> str:
    """The settings that make the run ask for resource ``res``."""
    fields = []
    if res in cfg.placement.engine_resources:
        fields.append("placement.engine_resources")
    if res in cfg.placement.trainer_resources:
        fields.append("placement.trainer_resources")
    if res == "CPU":
        fields.append("rollout.actors, update.num_workers")
    if res == "GPU":
        fields.append("update.use_gpu, engine.tensor_parallel_size, update.num_workers")
    return ", ".join(fields) or "rollout.actors, update.num_workers"


def _add(a: dict[str, float], b: Mapping[str, float], times: float = 1.0) -> dict[str, float]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0.0) + v * times
    return out


def run_demand(cfg: RLCRConfig) -> dict[str, dict[str, float]]:
    """What a run holds at once in each phase. The trainer's ``num_workers`` workers live for the whole run
    (they hold their resources through the rollouts and evaluations too), and so do the engines, except
    during the update with ``engine.release_during_update``.

    ``rollouts`` (and the held-out evaluations, the same pipeline): engines + trainer workers + two stages of
    ``rollout.actors`` stage tasks + one cheap step; ``update``: trainer workers (+ engines unless released).
    """
    engines = _add({}, engine_actor_resources(cfg), cfg.rollout.actors)
    workers = _add({}, trainer_worker_resources(cfg), cfg.update.num_workers)
    rollouts = _add(_add(engines, workers), {"CPU": STAGE_ACTOR_CPUS}, 2 * cfg.rollout.actors + 1)
    update = workers if cfg.engine.release_during_update else _add(engines, workers)
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
            f"{cfg.rollout.actors} engine actor(s) × {engines} kept for the whole run (rollout.actors, "
            f"engine.tensor_parallel_size, placement.engine_resources) plus {cfg.update.num_workers} trainer "
            f"worker(s) × {worker} also kept for the whole run (update.num_workers, update.use_gpu, "
            "placement.trainer_resources) plus the rollouts' stage tasks "
            f"({STAGE_ACTOR_CPUS:g} CPU each). Lower update.num_workers or rollout.actors, or add nodes.")


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
    cluster's), a local ``storage.uri`` would put each node's checkpoints on its own disk, and a local
    ``model`` (a path, or a name such as ``smollm2-135m-instruct`` that resolves into the driver's cache)
    would not exist on the nodes that run the engines and the trainer. Both are refused with
    :class:`StorageNotShared` unless ``placement.storage_shared`` declares them the same files on every node (an NFS
    mount; a model baked into the image at that path). ``s3://`` needs no such declaration.
    """
    if cfg.placement.storage_shared:
        return
    local = [(name, cfg.get(name)) for name in ("storage.uri", "model.name") if _is_local(cfg.get(name))]
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
        f"nodes would read and write their own disks, not this one. Use s3:// (storage.uri=s3://bucket/prefix, "
        f"model.name=s3://… a sealed checkpoint, storage.s3_endpoint_url for an S3-compatible server), or set "
        f"placement.storage_shared=true if the path is the same filesystem on every node (e.g. an NFS mount).")


# ----------------------------------------------------------------------------- storage reachability


def check_storage_reachable(cfg: RLCRConfig, timeout_s: float = 15.0, *, uri: str | None = None,
                            read_only: bool = False) -> None:
    """Raise :class:`StorageUnreachable` naming the field, the URI and what to do unless the run's storage
    (``storage.uri``, or ``uri``) and an ``s3://`` ``model`` can be used (:func:`storage_problem`; ``read_only``:
    by a command that only reads); each check answers within about ``timeout_s`` seconds and writes nothing."""
    checks = [("storage.uri", uri or cfg.storage.uri)]
    if cfg.model.name.startswith("s3://"):
        checks.append(("model.name", cfg.model.name))
    for name, value in checks:
        problem = storage_problem(value, cfg.storage.s3_endpoint_url, timeout_s, read_only=read_only)
        if problem:
            from rlcr.untrusted import printable

            raise StorageUnreachable(f"{name} {printable(value, 300)}: {problem}")


def storage_problem(uri: str, endpoint_url: str | None = None, timeout_s: float = 15.0, *,
                    read_only: bool = False) -> str | None:
    """What keeps ``uri`` from being used as a store (one line: the cause and what to do), or None.

    A local directory must exist and be writable, or be creatable (its nearest existing parent writable);
    ``read_only`` (a command that only reads): exist and be readable (a read-only store is fine, nothing is created);
    an ``s3://bucket/prefix`` must answer a one-key listing within ``timeout_s`` (one attempt, at
    ``endpoint_url``, else ``$AWS_ENDPOINT_URL_S3``/``$AWS_ENDPOINT_URL`` as :class:`rlcr.storage.Store`
    reads them, else AWS); any other protocol must be one fsspec has installed."""
    if "://" not in uri or uri.startswith("file://"):
        return _local_problem(Path(uri.removeprefix("file://")).expanduser(), read_only)
    protocol = uri.split("://", 1)[0]
    if protocol in ("s3", "s3a"):
        endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        return _s3_problem(uri, endpoint, timeout_s)
    try:
        import fsspec

        fsspec.get_filesystem_class(protocol)
    except (ImportError, ValueError) as e:
        from rlcr.untrusted import printable

        return f"protocol {protocol!r} is not available ({printable(e, 200)}); use a local path or s3://"
    return None


def _local_problem(path: Path, read_only: bool = False) -> str | None:
    from rlcr.storage.local import KERNEL_TREES

    if any(str(path.resolve()) == t or str(path.resolve()).startswith(t + "/") for t in KERNEL_TREES):
        return "a kernel file system (/proc, /sys, /dev) cannot hold a store"
    if read_only:
        if not path.is_dir():
            return "no such directory (a command that only reads creates nothing: check the path)"
        return None if os.access(path, os.R_OK | os.X_OK) else "the directory is not readable by this user"
    if path.exists():
        if not path.is_dir():
            return "exists and is not a directory"
        return None if os.access(path, os.W_OK | os.X_OK) else "the directory is not writable by this user"
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"cannot be created: {parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot be created: {parent} is not writable by this user"
    return None


def _s3_problem(uri: str, endpoint: str | None, timeout_s: float) -> str | None:
    """One listing of at most one key under the prefix, in a thread that is given up on after ``timeout_s``."""
    bucket, _, prefix = uri.split("://", 1)[1].partition("/")
    if not bucket:
        return "no bucket named: expected s3://bucket/prefix"
    where = f"the S3 endpoint {endpoint}" if endpoint else "AWS S3"
    answer: list[str | None] = []

    def ask() -> None:
        try:
            answer.append(_list_one(bucket, prefix, endpoint, timeout_s, where))
        except Exception as e:  # noqa: BLE001 — reported, not raised, from this thread
            answer.append(f"{type(e).__name__}: {e}")

    thread = threading.Thread(target=ask, name="rlcr-storage-check", daemon=True)
    thread.start()
    thread.join(timeout_s + 1.0)
    if not answer:
        return (f"no answer from {where} within {timeout_s:.0f} s; check storage.s3_endpoint_url (or AWS_ENDPOINT_URL) "
                "and that the server is up")
    return answer[0]


def _list_one(bucket: str, prefix: str, endpoint: str | None, timeout_s: float, where: str) -> str | None:
    from botocore import exceptions as bx
    from botocore.config import Config
    from botocore.session import get_session

    config = Config(connect_timeout=min(5.0, timeout_s), read_timeout=timeout_s,
                    retries={"total_max_attempts": 1, "mode": "standard"})
    try:
        client = get_session().create_client("s3", endpoint_url=endpoint, config=config)
        client.list_objects_v2(Bucket=bucket, Prefix=prefix.strip("/"), MaxKeys=1)
    except (bx.NoCredentialsError, bx.PartialCredentialsError):
        return ("no AWS credentials found; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), "
                "or use a local storage.uri")
    except (bx.EndpointConnectionError, bx.ConnectTimeoutError, bx.ReadTimeoutError) as e:
        return f"cannot reach {where} ({type(e).__name__}); check storage.s3_endpoint_url (or AWS_ENDPOINT_URL) " \
               "and that the server is up"
    except bx.ClientError as e:
        code = str(e.response.get("Error", {}).get("Code", ""))
        if code in ("NoSuchBucket", "404"):
            return (f"bucket {bucket!r} does not exist at {where}; create it (aws s3 mb s3://{bucket}) or fix "
                    "storage.uri")
        if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403", "ExpiredToken",
                    "InvalidToken", "AllAccessDisabled"):
            return (f"{where} refused the request ({code}); check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or "
                    f"AWS_PROFILE) and the permissions on bucket {bucket!r}")
        return f"{where} answered {code or type(e).__name__}: {e}"
    except ValueError as e:  # an endpoint URL botocore cannot use
        return f"cannot use the endpoint {endpoint!r} ({e}); fix storage.s3_endpoint_url"
    return None
