"""Beyond one machine: placement as configuration, refusing what cannot work, and a real two-node cluster.

The units (no Ray) check that ``placement.engine_resources``/``placement.trainer_resources`` reach what each engine
actor and trainer worker asks for and the fit check, and when a local path is refused on a multi-node cluster.

The cluster test starts a real Ray head (``ray start --head``, 1 CPU) and a second node (4 CPUs and the
custom resource ``worker_node``) as separate raylets on 127.0.0.1, each with its own temp dir, ``HOME``,
``RLCR_CACHE`` and ``TMPDIR``; the flow's driver is a third process (its own ``HOME``/``RLCR_CACHE`` too)
attached to the head. Storage, and the initial model, are on the session's moto S3 server. With
``placement.engine_resources``/``placement.trainer_resources`` = ``{"worker_node": 1}`` the engine pool and the Ray
Train worker run on the second node while the driver runs on the head: one iteration to commit, then a resume to a
second one. The second node fetches each checkpoint it uses from S3 into its own cache; the driver's cache
holds a poisoned copy of the model's weights, which nothing may read. Tear-down kills exactly the process
groups it started (and any process still naming the test's own temp dir), never ``ray stop``.

Measured on the 2-core machine alone (2026-11-24): the whole module 165 s, the cluster test 143 s plus 17 s
of fixtures. While three other Ray clusters ran vLLM beside it (load average ~30) it took 15 min, of which
the two flow runs took 8 and 5 min (engine and trainer start, Ray Data's first actors).
"""

import hashlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from rlcr.config import ConfigError, RLCRConfig, changes_results, result_changing_diff
from rlcr.runs.cluster import (
    ResourceError,
    StorageNotShared,
    check_fits,
    check_storage,
    engine_actor_resources,
    engines_start_beside_trainer,
    run_demand,
    trainer_worker_resources,
)
from test_task_plugins import _install_example

HERE = Path(__file__).parent
ROOT = HERE.parent
PLACEMENT = ("engine_resources", "trainer_resources", "storage_shared")


# ----------------------------------------------------------------------------- units (no Ray)


def test_placement_fields_are_documented_operational_and_validated():
    cfg = RLCRConfig()
    assert (cfg.placement.engine_resources == {} and cfg.placement.trainer_resources == {}
            and cfg.placement.storage_shared is False)
    for name in PLACEMENT:
        field = dict(RLCRConfig.dotted_fields())[f"placement.{name}"]
        assert field.description
        assert not changes_results(field)
    moved = RLCRConfig(placement={"engine_resources": {"worker_node": 1}, "trainer_resources": {"gpu_node": 0.5},
                                  "storage_shared": True})
    assert result_changing_diff(cfg.model_dump(mode="json"), moved) == []  # a resume may move the run
    assert (RLCRConfig.from_yaml(None, ["placement.engine_resources={worker_node: 2}"]).placement.engine_resources
            == {"worker_node": 2.0})
    for bad, words in [({"CPU": 1}, "'CPU' is not an extra resource"), ({"GPU": 1}, "'GPU'"),
                       ({"memory": 1e9}, "'memory'"), ({"w": 0}, "amount > 0"), ({"w": -1}, "amount > 0"),
                       ({"w": 1e-5}, "0.0001"), ({"": 1}, "non-empty"), ({"w": float("nan")}, "finite")]:
        for field in ("engine_resources", "trainer_resources"):
            with pytest.raises(ConfigError, match=field) as e:
                RLCRConfig.from_dict({f"placement.{field}": bad})
            assert words in str(e.value)


def test_custom_resources_reach_each_actor_and_the_demand():
    cfg = RLCRConfig(placement={"engine_resources": {"worker_node": 1},
                                "trainer_resources": {"worker_node": 1, "fast_disk": 0.5}},
                     rollout={"actors": 2}, update={"num_workers": 3})
    assert engine_actor_resources(cfg) == {"CPU": 0.5, "worker_node": 1.0}
    assert trainer_worker_resources(cfg) == {"CPU": 1.0, "worker_node": 1.0, "fast_disk": 0.5}
    demand = run_demand(cfg)
    # the trainer's workers live for the whole run: they hold their units through the rollouts too
    assert demand["rollouts"]["worker_node"] == 2.0 + 3.0 and demand["rollouts"]["fast_disk"] == 1.5
    assert demand["update"]["worker_node"] == 2.0 + 3.0 and demand["update"]["fast_disk"] == 1.5
    gpu = RLCRConfig(update={"use_gpu": True}, engine={"tensor_parallel_size": 2},
                     placement={"engine_resources": {"gpu_pool": 1}, "trainer_resources": {"gpu_pool": 1}})
    assert engine_actor_resources(gpu) == {"CPU": 0.5, "GPU": 2.0, "gpu_pool": 1.0}
    assert trainer_worker_resources(gpu) == {"GPU": 1.0, "gpu_pool": 1.0}
    plain = RLCRConfig()  # no placement: exactly what was asked before (Ray Train's defaults)
    assert engine_actor_resources(plain) == {"CPU": 0.5} and trainer_worker_resources(plain) == {"CPU": 1.0}


def test_engines_load_beside_the_trainer_unless_both_are_on_gpus():
    """A run's start: the engines load while the trainer starts on CPUs; with GPUs one after the other (vLLM sizes
    its KV cache from the device's free memory as it starts)."""
    assert engines_start_beside_trainer(RLCRConfig())
    assert not engines_start_beside_trainer(RLCRConfig(update={"use_gpu": True}))


def test_trainer_scaling_config_takes_the_worker_resources():
    from ray.train import ScalingConfig

    for cfg, want in [(RLCRConfig(), {"CPU": 1.0}),
                      (RLCRConfig(placement={"trainer_resources": {"worker_node": 1}}),
                       {"CPU": 1.0, "worker_node": 1.0}),
                      (RLCRConfig(update={"use_gpu": True}, placement={"trainer_resources": {"a100": 1}}),
                       {"GPU": 1.0, "a100": 1.0})]:
        sc = ScalingConfig(num_workers=2, use_gpu=cfg.update.use_gpu,
                           resources_per_worker=trainer_worker_resources(cfg))
        assert sc._resources_per_worker_not_none == want


def test_a_run_that_cannot_be_placed_fails_naming_the_resource():
    cfg = RLCRConfig(placement={"engine_resources": {"worker_node": 1}, "trainer_resources": {"worker_node": 1}})
    with pytest.raises(ResourceError) as e:  # no node advertises it
        check_fits(cfg, {"CPU": 8.0})
    msg = str(e.value)
    assert "the rollouts phase needs 2 worker_node but the cluster has 0" in msg  # engine + trainer worker
    assert "the update phase needs 2 worker_node but the cluster has 0" in msg
    assert "placement.engine_resources, placement.trainer_resources" in msg and "ray start --resources" in msg
    with pytest.raises(ResourceError, match="the update phase needs 2 worker_node but the cluster has 1"):
        check_fits(cfg, {"CPU": 8.0, "worker_node": 1.0})  # the engine keeps its unit through the update
    check_fits(cfg, {"CPU": 8.0, "worker_node": 2.0})
    check_fits(cfg, {"CPU": 5.0, "worker_node": 4.0},
               [{"CPU": 1.0}, {"CPU": 4.0, "worker_node": 4.0}])  # the test's two-node cluster
    # the totals hold, but no single node has both a GPU and the custom resource the engine asks for
    gpu = RLCRConfig(update={"use_gpu": True}, placement={"engine_resources": {"gpu_pool": 1}})
    with pytest.raises(ResourceError, match="no single node has all of an engine actor's"):
        check_fits(gpu, {"CPU": 8.0, "GPU": 2.0, "gpu_pool": 1.0},
                   [{"CPU": 4.0, "GPU": 2.0}, {"CPU": 4.0, "gpu_pool": 1.0}])
    check_fits(gpu, {"CPU": 8.0, "GPU": 2.0, "gpu_pool": 1.0},
               [{"CPU": 4.0}, {"CPU": 4.0, "GPU": 2.0, "gpu_pool": 1.0}])


def _nodes(alive: int, dead: int = 0) -> list[dict]:
    return [{"NodeID": f"n{i}", "Alive": i < alive} for i in range(alive + dead)]


def test_an_engine_takes_the_cores_of_its_own_node():
    """The runtime env computed on the driver sets OMP_NUM_THREADS from the driver's machine; on the node
    where an engine starts, ``use_this_nodes_cores`` resets torch's threads to that node's cores (here: a
    process told 1 thread, as Ray tells a fractional-CPU actor, gets the machine's)."""
    cores = len(os.sched_getaffinity(0))
    code = ("from rlcr.rollout.engine import use_this_nodes_cores; import torch, os; "
            "n = use_this_nodes_cores(); print(n, torch.get_num_threads(), os.environ['OMP_NUM_THREADS'])")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "OMP_NUM_THREADS": "1"},
                         capture_output=True, text=True, timeout=120, check=True).stdout.split()
    assert out == [str(cores)] * 3


def test_local_storage_is_refused_on_a_multi_node_cluster(tmp_path):
    s3 = {"storage.uri": "s3://bucket/rlcr", "model.name": "s3://bucket/models/m"}
    local = RLCRConfig(storage={"uri": str(tmp_path / "runs")}, model={"name": "s3://bucket/models/m"})
    with pytest.raises(StorageNotShared) as e:
        check_storage(local, _nodes(2))
    msg = str(e.value)
    assert f"storage.uri {str(tmp_path / 'runs')!r}" in msg and "2 alive nodes" in msg
    assert "placement.storage_shared=true" in msg and "s3://" in msg and "model" not in msg.split(":")[0]
    assert isinstance(e.value, ConfigError)
    with pytest.raises(StorageNotShared, match="3 alive nodes"):
        check_storage(local, _nodes(3, dead=1))
    check_storage(local, _nodes(1))  # one node: its disk is the only one
    check_storage(local, _nodes(1, dead=2))  # dead nodes do not count
    check_storage(local.model_copy(update={"placement.storage_shared": True}), _nodes(4))  # declared an NFS mount
    check_storage(RLCRConfig.from_dict(s3), _nodes(4))
    # a local model (a path, or a name that resolves into the driver's cache) is the same trap
    for model in (str(tmp_path), "smollm2-135m-instruct"):
        with pytest.raises(StorageNotShared, match=f"model.name {model!r}"):
            check_storage(RLCRConfig(storage={"uri": "s3://bucket/rlcr"}, model={"name": model}), _nodes(2))
    with pytest.raises(StorageNotShared, match="storage.uri 'file:///x' and model.name 'tiny'"):
        check_storage(RLCRConfig(storage={"uri": "file:///x"}, model={"name": "tiny"}), _nodes(2))


# ----------------------------------------------------------------------------- the two-node cluster


def _free_ports(n: int) -> list[int]:
    import socket

    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


class Node:
    """One ``ray start --block`` process group with its own HOME, RLCR_CACHE, TMPDIR and Ray temp dir."""

    def __init__(self, root: Path, name: str, args: list[str], env: dict[str, str]):
        self.name, self.dir = name, root / name
        self.home, self.cache, self.tmp = self.dir / "home", self.dir / "cache", self.dir / "tmp"
        for d in (self.home, self.cache, self.tmp):
            d.mkdir(parents=True)
        self.log = self.dir / "ray-start.log"
        node_env = {**env, "HOME": str(self.home), "RLCR_CACHE": str(self.cache), "TMPDIR": str(self.tmp)}
        agent, grpc, env_agent, metrics, manager, objects = _free_ports(6)
        cmd = [str(Path(sys.executable).parent / "ray"), "start", "--block", "--node-ip-address=127.0.0.1",
               f"--temp-dir={self.dir / 'ray'}", "--num-gpus=0", "--object-store-memory=100000000",
               "--disable-usage-stats", f"--dashboard-agent-listen-port={agent}",
               f"--dashboard-agent-grpc-port={grpc}", f"--runtime-env-agent-port={env_agent}",
               f"--metrics-export-port={metrics}", f"--node-manager-port={manager}",
               f"--object-manager-port={objects}", *args]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(cmd, env=node_env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True, cwd=self.dir)

    def wait_started(self, timeout_s: float = 180.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if b"Ray runtime started" in self.log.read_bytes():
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.5)
        raise RuntimeError(f"ray node {self.name} did not start (rc {self.proc.poll()}):\n"
                           + self.log.read_text(errors="replace")[-4000:])

    def stop(self) -> None:
        """SIGTERM to the process group this test started (ray start stops its raylet), SIGKILL if it lingers."""
        for sig, wait_s in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=wait_s)
                if not _group_alive(self.proc.pid):
                    return
            except subprocess.TimeoutExpired:
                pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def _processes_naming(text: str) -> list[int]:
    """Pids whose environment or command line contains ``text`` (the test's own temp dir, in every node's
    HOME/RLCR_CACHE: only processes this test started, Ray's workers included, which sit in process groups of
    their own and rename themselves ``ray::…``)."""
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit() and int(p.name) != os.getpid():
            try:
                if text.encode() in (p / "environ").read_bytes() or text.encode() in (p / "cmdline").read_bytes():
                    pids.append(int(p.name))
            except OSError:
                pass
    return pids


@contextmanager
def two_node_cluster(root: Path):
    """A Ray head (1 CPU) and a second node (4 CPUs, ``worker_node``: 4) on 127.0.0.1; yields (address, head,
    worker, env of the cluster's processes). Stops both on exit, whatever happened."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") and k not in ("RLCR_CACHE", "PYTHONPATH")}
    # the cluster's shared secret (KubeRay: a Secret in every pod's env), not a file in anyone's HOME
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32), RAY_USAGE_STATS_ENABLED="0",
               RAY_raylet_start_wait_time_s="180")  # a loaded 2-core machine registers a raylet slowly
    gcs, client, dashboard = _free_ports(3)
    address = f"127.0.0.1:{gcs}"
    nodes = []
    try:
        head = Node(root, "head", ["--head", f"--port={gcs}", "--num-cpus=1", "--include-dashboard=false",
                                   f"--ray-client-server-port={client}", f"--dashboard-port={dashboard}"], env)
        nodes.append(head)
        head.wait_started()
        worker = Node(root, "worker", [f"--address={address}", "--num-cpus=4", '--resources={"worker_node": 4}'],
                      env)
        nodes.append(worker)
        worker.wait_started()
        yield address, head, worker, env
    finally:
        for node in reversed(nodes):
            node.stop()
        deadline = time.monotonic() + 20  # Ray's workers exit on their own once their raylet is gone
        while (left := _processes_naming(str(root))) and time.monotonic() < deadline:
            time.sleep(0.5)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if left:
            print(f"killed {len(left)} process(es) of the test's cluster left after its nodes stopped: {left}")
        assert not [n.name for n in nodes if n.proc.poll() is None], "a ray node did not stop"


def run_driver(env: dict, overrides: dict, run_id: str, iterations: int, timeout_s: float = 900.0):
    """The flow in its own process (and process group), attached to the cluster; returns (rc, output, lines)."""
    args = [sys.executable, str(HERE / "multinode_flow.py"), json.dumps(overrides), run_id, str(iterations)]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=ROOT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"the flow did not finish within {timeout_s:.0f} s:\n{out[-6000:]}") from None
    finally:
        if _group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
    lines = {}
    for line in out.splitlines():
        key, _, rest = line.partition(" ")
        if key in ("NODES", "DRIVER_NODE", "ENGINE_NODES", "SUMMARY", "FLOW_RETURNED"):
            lines.setdefault(key, json.loads(rest))
    return proc.returncode, out, lines


def _cache_entry(cache: Path, uri: str, seal: bytes) -> Path:
    """Where :func:`rlcr.storage.fetch_checkpoint` keeps ``uri`` (sealed with ``seal``) in a node's cache."""
    content_id = json.loads(seal)["content_id"]
    return cache / "checkpoints" / f"{hashlib.sha256(uri.encode()).hexdigest()[:20]}-{content_id[:24]}"


def test_two_node_cluster_places_engines_and_trainer_on_the_worker_node_with_s3_storage(
        prefect_harness, s3, tiny_model_dir, tmp_path):
    t0 = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="rlcr-mn-", dir="/tmp"))  # short: Ray's socket paths live under it
    try:
        _two_node_run(root, s3, tiny_model_dir, logs=tmp_path, t0=t0)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"two-node test: {time.perf_counter() - t0:.1f} s in all")


def _two_node_run(root: Path, s3, tiny_model_dir, *, logs: Path, t0: float) -> None:
    from prefect.settings import PREFECT_API_URL

    from rlcr.runs.store import RunStore
    from rlcr.storage import Store, default_cache_dir, fetch_checkpoint
    from s3server import BUCKET

    times = {}
    prefix = f"multinode-{root.name}"
    model_uri = Store(f"s3://{BUCKET}/{prefix}", endpoint_url=s3.endpoint).put_dir(tiny_model_dir, "model")
    model_seal = s3.client().get_object(Bucket=BUCKET, Key=f"{prefix}/model/_COMPLETE")["Body"].read()
    overrides = {
        "model.name": model_uri, "storage.uri": f"s3://{BUCKET}/{prefix}/store", "storage.s3_endpoint_url": s3.endpoint,
        "placement.engine_resources": {"worker_node": 1}, "placement.trainer_resources": {"worker_node": 1},
        "rollout.prompts_per_iteration": 2, "rollout.num_generations_answer": 2,
        "rollout.num_generations_confidence": 2, "tasks.num_train": 16, "tasks.num_eval": 4, "rollout.temperature": 1.0,
        "rollout.max_answer_tokens": 16, "rollout.max_confidence_tokens": 8, "engine.max_model_len": 512,
        "engine.kv_cache_gib": 0.25, "update.learning_rate": 1e-4, "orchestration.retries": 0, "eval.every": 0,
        "tasks.name": "sumlist", "tasks.options.max_len": 3,  # the example task package (examples/sumlist)
    }
    # installed as a wheel into a layer on the driver's PYTHONPATH only: the nodes' workers get its code from
    # the Ray runtime environment (py_modules), as on a cluster of other machines
    layer = _install_example(root / "example")
    # the driver: its own HOME and cache, in which the model's weights are poisoned (its seal intact, so a
    # cache hit serves them): a process that read the driver's cache for weights would fail to load them
    driver = root / "driver"
    for d in ("home", "cache", "tmp"):
        (driver / d).mkdir(parents=True)
    poisoned = fetch_checkpoint(model_uri, endpoint_url=s3.endpoint, cache_dir=driver / "cache" / "checkpoints")
    assert poisoned == _cache_entry(driver / "cache", model_uri, model_seal)
    (poisoned / "model.safetensors").write_bytes(b"poisoned: the second node must not read this")
    placements = []
    try:
        with two_node_cluster(root) as (address, head, worker, env):
            times["cluster start"] = time.perf_counter() - t0
            driver_env = {**env, "RAY_ADDRESS": address, "PREFECT_API_URL": PREFECT_API_URL.value(),
                          "PYTHONPATH": os.pathsep.join([str(ROOT), str(layer)]), "HOME": str(driver / "home"),
                          "RLCR_CACHE": str(driver / "cache"), "TMPDIR": str(driver / "tmp")}

            # refused: a local storage_uri on this two-node cluster
            t = time.perf_counter()
            rc, out, lines = run_driver(driver_env, {**overrides, "storage.uri": str(root / "local-store")},
                                        "refused", 1, timeout_s=300)
            (logs / "driver-refused.log").write_text(out)
            times["refusal"] = time.perf_counter() - t
            assert rc != 0 and "StorageNotShared" in out, out[-6000:]
            assert f"storage.uri {str(root / 'local-store')!r}: a local path on a Ray cluster of 2 alive nodes" in out
            assert "placement.storage_shared=true" in out
            assert "ENGINE_NODES" not in lines  # refused before any engine started
            nodes = lines["NODES"]
            assert len(nodes) == 2
            head_id = next(n["node_id"] for n in nodes if n["head"])
            worker_id = next(n["node_id"] for n in nodes if not n["head"])
            assert next(n for n in nodes if not n["head"])["resources"]["worker_node"] == 4.0
            assert next(n for n in nodes if n["head"])["resources"]["CPU"] == 1.0

            # iteration 1, committed; then a resume adds iteration 2
            for k in (1, 2):
                t = time.perf_counter()
                rc, out, lines = run_driver(driver_env, overrides, "two-nodes", k)
                (logs / f"driver-{k}.log").write_text(out)
                times[f"flow to iteration {k}"] = time.perf_counter() - t
                if "FLOW_RETURNED" in lines:
                    times[f"driver exit {k}"] = time.time() - lines["FLOW_RETURNED"]
                assert rc == 0, out[-8000:]
                assert lines["SUMMARY"]["iterations"] == [k], out[-4000:]
                placements.append((lines["DRIVER_NODE"], lines["ENGINE_NODES"]))
            t = time.perf_counter()
        times["cluster stop"] = time.perf_counter() - t
    finally:
        print(f"\ntwo-node test timings (s): { {k: round(v, 1) for k, v in times.items()} }")

    print(f"head node {head_id}, second node {worker_id}; (driver node, engine nodes) per run: {placements}")
    for driver_node, engine_nodes in placements:
        assert driver_node == head_id  # the driver on the head ...
        assert engine_nodes == [worker_id]  # ... the engine pool on the second node

    # the committed artifacts, complete on S3
    run = RunStore.open(RLCRConfig.from_dict({"storage.uri": overrides["storage.uri"],
                                              "storage.s3_endpoint_url": s3.endpoint}), "two-nodes")
    assert run.store.read_json(run.config_rel)["config"]["tasks"]["name"] == "sumlist"
    manifests = run.committed()
    assert [m["iteration"] for m in manifests] == [1, 2]
    keys = set(s3.keys(f"{prefix}/store/"))
    base = f"{prefix}/store/runs/two-nodes"
    assert f"{base}/config.json" in keys
    for k, m in zip((1, 2), manifests):
        it = f"{base}/iter-{k:04d}"
        assert f"{it}/manifest.json" in keys
        it = f"{it}/attempt-{m['attempt']}"  # the artifacts of the attempt that committed it, as its manifest names
        assert [run.store.rel(m[f]) for f in ("metrics_uri", "rollouts_uri", "checkpoint_uri")] == [
            f"{it}/{rel}".removeprefix(f"{prefix}/store/")
            for rel in ("metrics.json", "rollouts/rollouts.parquet", "checkpoint")]
        for rel in ("metrics.json", "rollouts/rollouts.parquet", "checkpoint/_COMPLETE",
                    "checkpoint/model.safetensors", "checkpoint/config.json", "checkpoint/tokenizer.json"):
            assert f"{it}/{rel}" in keys, rel
        assert run.store.content_id(run.store.rel(m["checkpoint_uri"])) == m["state_content_id"]
        metrics = run.metrics(k)
        print(f"iteration {k} timings (s):", {n: round(v, 1) for n, v in metrics["timings"].items()
                                              if isinstance(v, (int, float))})
        assert [w["node_id"] for w in metrics["update"]["workers"]] == [worker_id]  # the trainer on the second node
        assert metrics["engines"]["policy"] == m["checkpoint_uri"]
        rollouts = run.store.read_parquet(run.store.rel(m["rollouts_uri"]))
        assert rollouts.num_rows > 0 and "nums" in rollouts.column_names  # the example task's rows
        assert all(1 <= len(nums) <= 3 for nums in rollouts.column("nums").to_pylist())  # tasks.options.max_len
    assert manifests[1]["policy_in"] == manifests[0]["checkpoint_uri"]
    assert not [key for key in keys if ".tmp-" in key]
    assert not run.store.exists(run.lease_rel)

    # the run holds its own copy of the sealed model it was given (models/<content id>, so that no pruning of the
    # source can take it away); the second node fetched from S3, into its own cache, that copy (run 1) and
    # iteration 1's state (the resume); the driver's, the head's and this process's caches never held iteration 1's
    initial = run.initial_model()
    assert initial["source"] == model_uri
    copy_uri = run.store.url(initial["model"])
    ckpt1 = manifests[0]["checkpoint_uri"]
    seal1 = run.store.read_bytes(f"{run.store.rel(ckpt1)}/_COMPLETE")
    for uri, seal in ((copy_uri, run.store.read_bytes(f"{initial['model']}/_COMPLETE")), (ckpt1, seal1)):
        entry = _cache_entry(worker.cache, uri, seal)
        assert (entry / "_COMPLETE").read_bytes() == seal, sorted(p.name for p in entry.parent.iterdir())
        assert (entry / "model.safetensors").stat().st_size > 1000
    for cache in (driver / "cache", head.cache, default_cache_dir()):
        assert not _cache_entry(cache, ckpt1, seal1).exists(), cache
    assert (poisoned / "model.safetensors").read_bytes().startswith(b"poisoned")  # still poisoned, and unused
