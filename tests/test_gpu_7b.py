"""The 7B recipe (configs/gpu-7b.yaml, infra/rayjob-7b.yaml), checked statically: the static checks of infra/ pass
for both RayJobs, the 7B run fits its 8-GPU pod and not a smaller one, and the cost model puts FSDP's per-GPU
training state under an H100's memory at four workers and over it at two."""

import copy
import importlib.util
import subprocess
import sys
from pathlib import Path

import yaml

from rlcr.config import load_config
from rlcr.runs.cluster import check_fits, run_demand

ROOT = Path(__file__).resolve().parents[1]


def _module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_static_checks_pass_for_both_rayjobs():
    out = subprocess.run([sys.executable, str(ROOT / "infra" / "check_manifests.py")], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-3000:]
    for job in ("rayjob.yaml", "rayjob-7b.yaml"):
        assert f"ok    {job}: engines + trainer workers fit" in out.stdout, job
        assert f"ok    {job} entrypoint: config + overrides load (rlcr.config)" in out.stdout, job
    assert "configs/gpu-7b.yaml" in out.stdout


def test_the_7b_run_shards_its_update_and_fits_one_8_gpu_pod_only():
    import pytest

    from rlcr.runs.cluster import ResourceError

    cfg = load_config(str(ROOT / "configs" / "gpu-7b.yaml"), [])
    assert cfg.update.fsdp and cfg.update.num_workers == 4 and cfg.update.use_gpu and not cfg.lora.enabled
    assert cfg.update.fsdp_param_dtype == "bfloat16" and cfg.model.dtype == "bfloat16"
    assert run_demand(cfg)["update"]["GPU"] == 5.0  # one engine + four trainer workers, kept for the run
    check_fits(cfg, {"CPU": 64.0, "GPU": 8.0})
    with pytest.raises(ResourceError, match="needs 5 GPU"):
        check_fits(cfg, {"CPU": 64.0, "GPU": 4.0})

    # the RayJob's own check: the same job on a pod of 4 GPUs is refused by the flow's fit check
    checks = _module("check_manifests", ROOT / "infra" / "check_manifests.py")
    doc = yaml.safe_load((ROOT / "infra" / "rayjob-7b.yaml").read_text())
    small = copy.deepcopy(doc)
    for side in ("requests", "limits"):
        small["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"][
            side]["nvidia.com/gpu"] = "4"
    for d, ok in ((doc, True), (small, False)):
        report = checks.Report()
        checks.check_rayjob(report, d, "ghcr.io/your-org/rlcr:latest", checks.ray_version_pinned(),
                            checks.rlcr_modules(), where="rayjob-7b.yaml")
        fit_failed = "rayjob-7b.yaml: engines + trainer workers fit" in report.failed
        assert fit_failed is not ok, report.failed


def test_the_cost_model_needs_four_fsdp_workers_at_7b():
    cost = _module("cost_model", ROOT / "infra" / "cost_model.py")
    h100 = 80e9
    assert cost.trainer_memory(cost.QWEN_7B, 4) < h100 < cost.trainer_memory(cost.QWEN_7B, 2)
    assert cost.trainer_memory(cost.QWEN_1_5B, 1) < h100  # 1.5B needs no sharding (configs/gpu.yaml)
    assert 16 * cost.QWEN_7B.params > 1.4 * h100  # the unsharded state alone exceeds even an H200 (141 GB)
