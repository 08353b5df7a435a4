"""``orchestration.mode: one-step-off``: iteration k+1's rollouts are generated during iteration k's update, at
most one update stale, recorded per row; exactly once under SIGKILL at any point (docs/design.md §12).

`make test` runs one uninterrupted 3-iteration run (in this process) and checks what it records, and what a resume
reads. The SIGKILL matrix (``extended``: `make test-extended`) runs that reference again against one run SIGKILLed
four times (each a separate Python process joined to this session's Ray cluster and Prefect server, as in
tests/test_kill.py): during the generation of iteration 2 (which runs beside iteration 1's update), during
iteration 2's update (beside iteration 3's generation), between them (iteration 3's rollouts generated, not yet
written), and as iteration 2 commits; then resumed to the end. Its committed records (every rollout column but
the run id, the update's loss, the final weights) equal the uninterrupted run's, and every iteration trained on
the rollouts the previous manifest named: none lost, none sampled twice.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rlcr.config import RLCRConfig
from rlcr.runs.store import RunStore
from rlcr.untrusted import InvalidInput

HERE = Path(__file__).parent


def overrides(tiny_model_dir, store):
    return {
        "model.name": str(tiny_model_dir), "storage.uri": str(store), "rollout.prompts_per_iteration": 2,
        "rollout.num_generations_answer": 2, "rollout.num_generations_confidence": 2, "tasks.num_train": 16,
        "tasks.num_eval": 4, "rollout.temperature": 1.0, "rollout.max_answer_tokens": 16,
        "rollout.max_confidence_tokens": 8, "engine.max_model_len": 512, "engine.kv_cache_gib": 0.25,
        "update.learning_rate": 1e-3, "orchestration.retries": 0, "eval.every": 0, "tracking.backend": "none",
        "orchestration.mode": "one-step-off", "loss.tis_cap": 2.0,
        "loss.entropy_coef": 0.05,  # the tiny model earns no reward: the entropy bonus makes every update move it
    }


def run_flow(env, over, run_id, iterations, *kill):
    args = [sys.executable, str(HERE / "kill_flow.py"), json.dumps(over), run_id, str(iterations), *map(str, kill)]
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=600, cwd=HERE.parent)


def records(run: RunStore, manifest) -> list[dict]:
    return pq.read_table(manifest["rollouts_uri"]).drop(["run_id"]).to_pylist()


def reference_run(tiny_model_dir, tmp_path):
    """The uninterrupted 3-iteration one-step-off run, in this process: its RunStore, committed manifests, config."""
    from flows.train import rlcr_train

    ref_over = overrides(tiny_model_dir, tmp_path / "ref")
    rlcr_train(overrides=ref_over, run_id="r", iterations=3)
    cfg = RLCRConfig.from_dict(ref_over)
    ref = RunStore.open(cfg, "r")
    return ref, ref.committed(), cfg


@pytest.fixture(scope="module")
def reference(ray_local, prefect_harness, tiny_model_dir, tmp_path_factory):
    """:func:`reference_run`, once for the tests of this module that read it."""
    return reference_run(tiny_model_dir, tmp_path_factory.mktemp("one-step-off"))


def test_one_step_off_samples_one_update_ahead_and_a_resume_reads_exactly_those_rollouts(reference, tmp_path):
    from rlcr.rollout.ahead import read_ahead
    from rlcr.runs.task_sets import prompts_for_iteration, task_sets

    ref, m, cfg = reference
    assert [x["rollouts_version"] for x in m] == [0, 0, 1]  # iteration k+1 sampled by the policy after k − 1
    assert [ref.metrics(k)["rollout"]["staleness"] for k in (1, 2, 3)] == [0.0, 1.0, 1.0]
    for k in (1, 2):  # each manifest names the next iteration's rollouts, which that iteration trained on
        assert m[k]["rollouts_uri"] == m[k - 1]["next_rollouts_uri"]
    assert m[2].get("next_rollouts_uri") is None  # the last: nothing sampled past the run
    for k, x in enumerate(m, 1):
        assert {r["policy_version"] for r in records(ref, x)} == {x["rollouts_version"]}
        update = ref.metrics(k)["update"]
        assert update["mismatch/tokens"] > 0 and update["mismatch/mean_abs"] >= 0.0  # measured every iteration
    assert ref.metrics(2)["timings"]["overlap_s"] > 0
    gap = [ref.metrics(k)["update"]["mismatch/mean_abs"] for k in (1, 2, 3)]
    assert gap[1] > 100 * gap[0] and gap[2] > 100 * gap[0], gap  # sampled by an older policy than the trainer's

    # what a resume reads is checked: an altered or missing file is refused, naming it, never re-sampled
    prompts = prompts_for_iteration(cfg, task_sets(cfg)[0], 2)
    got = read_ahead(ref, m[0], prompts, g_a=2, g_c=2)
    assert got.version == 0 and [r["completion_ids"] for r in got.result.rows] == \
        [r["completion_ids"] for r in records(ref, m[1])]
    local = Path(ref.store.url(ref.store.rel(m[0]["next_rollouts_uri"])))
    shutil.copy(local, tmp_path / "keep.parquet")
    local.write_bytes(local.read_bytes()[:-9] + b"x" * 9)
    with pytest.raises(InvalidInput, match="SHA-256 differs"):
        read_ahead(ref, m[0], prompts, g_a=2, g_c=2)
    local.unlink()
    with pytest.raises(InvalidInput, match="is gone"):
        read_ahead(ref, m[0], prompts, g_a=2, g_c=2)
    shutil.copy(tmp_path / "keep.parquet", local)
    with pytest.raises(InvalidInput, match="are not iteration 2.s"):
        read_ahead(ref, m[0], prompts_for_iteration(cfg, task_sets(cfg)[0], 3), g_a=2, g_c=2)


def test_one_step_off_under_fsdp_trains_as_the_single_worker_run(reference, tiny_model_dir, tmp_path):
    """Two FSDP2 workers (gloo) in one-step-off mode beside the reference (one DDP worker), three iterations: the
    same rollouts (iteration 2's sampled by the initial policy during iteration 1's sharded update), the same update
    (loss within 1e-4 relative: the update does not depend on the number of workers, docs/design.md §11), the same
    staleness records; iteration 3's rollouts, sampled from the weights synced out of the shards a bucket at a time
    after iteration 1, are the reference's tokens with its log-probs to float rounding."""
    from flows.train import rlcr_train

    ddp, m_ddp, _ = reference
    over = {**overrides(tiny_model_dir, tmp_path / "fsdp"), "update.fsdp": True, "update.num_workers": 2,
            "engine.sync_bucket_mib": 0.2}
    rlcr_train(overrides=over, run_id="r", iterations=3)
    fsdp = RunStore.open(RLCRConfig.from_dict(over), "r")
    m_fsdp = fsdp.committed()
    assert [x["rollouts_version"] for x in m_fsdp] == [x["rollouts_version"] for x in m_ddp] == [0, 0, 1]
    a, b = records(ddp, m_ddp[2]), records(fsdp, m_fsdp[2])
    assert [r["completion_ids"] for r in a] == [r["completion_ids"] for r in b]
    for ra, rb in zip(a, b):
        assert rb["completion_logprobs"] == pytest.approx(ra["completion_logprobs"], abs=1e-3)
    for a, b in zip(m_ddp[:2], m_fsdp[:2]):
        k = a["iteration"]
        assert [r["completion_ids"] for r in records(ddp, a)] == [r["completion_ids"] for r in records(fsdp, b)], k
        ua, ub = ddp.metrics(k)["update"], fsdp.metrics(k)["update"]
        assert ub["world_size"] == 2 and ua["world_size"] == 1
        assert ub["loss"] == pytest.approx(ua["loss"], rel=1e-4), k
        assert ub["weights_bytes"] == ua["weights_bytes"] and ub["weights_buckets"] > ua["weights_buckets"] == 1
    # iteration 2 sampled during iteration 1's sharded update, one update stale
    assert fsdp.metrics(2)["rollout"]["staleness"] == 1.0 and fsdp.metrics(1)["timings"]["overlap_s"] > 0


@pytest.mark.extended
def test_one_step_off_trains_each_rollout_exactly_once_across_sigkills(ray_local, prefect_harness, tiny_model_dir,
                                                                       tmp_path):
    import ray
    import torch
    from prefect.settings import PREFECT_API_URL
    from safetensors.torch import load_file

    ref, m, _ = reference_run(tiny_model_dir, tmp_path)
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address,
           "PREFECT_API_URL": PREFECT_API_URL.value(), "PYTHONPATH": str(HERE.parent)}
    over = overrides(tiny_model_dir, tmp_path / "killed")
    run = RunStore.open(RLCRConfig.from_dict(over), "r")
    for stage, at, committed in (("rollouts", 2, []),  # generating 2, beside 1's update
                                 ("update", 2, [1]),  # updating 2, beside 3's generation (2's rollouts: named by 1)
                                 ("advantages", 3, [1]),  # between: 3 generated, 2 updated, 3 not written
                                 ("commit", 2, [1])):  # as 2 commits
        p = run_flow(env, over, "r", 3, stage, at, 0)
        assert p.returncode == -9 and f"KILL {stage}@{at}" in p.stdout + p.stderr, (
            stage, (p.stdout + p.stderr)[-4000:])
        assert [x["iteration"] for x in run.committed()] == committed, stage
    p = run_flow(env, over, "r", 3)
    assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]
    n = run.committed()
    assert [x["iteration"] for x in n] == [1, 2, 3]
    for a, b in zip(m, n):
        assert records(ref, a) == records(run, b), a["iteration"]  # tokens, rewards, advantages, versions
        assert ref.metrics(a["iteration"])["update"]["loss"] == run.metrics(b["iteration"])["update"]["loss"]
    for k in (1, 2):
        assert n[k]["rollouts_uri"] == n[k - 1]["next_rollouts_uri"]
    # iteration 2 trained on the rollouts sampled before the first kill that left 1 committed: one file, reused
    assert f"/attempt-{n[0]['attempt']}/" in n[1]["rollouts_uri"] and n[1]["attempt"] != n[0]["attempt"]
    wa, wb = (load_file(f"{x['checkpoint_uri']}/model.safetensors") for x in (m[2], n[2]))
    assert all(torch.equal(wa[key], wb[key]) for key in wa)


def test_the_overlap_benchmark_reads_steady_iterations_and_idle_fractions():
    """bench/perf/overlap.py's figures: steady iterations are 2 … N−1; idle fractions from the flow's own timings."""
    from conftest import load_bench

    overlap = load_bench("overlap")

    def it(iteration_s, gen, upd, mismatch):
        return {"timings": {"iteration_s": iteration_s, "rollout/pipeline_s": gen, "update_s": upd,
                            "sync_weights_s": 1.0}, "update": {"mismatch/mean_abs": mismatch}, "eval": {}}

    runs = [it(100, 40, 50, 0.0), it(60, 40, 50, 0.02), it(54, 30, 50, 0.03)]
    figs = overlap.figures(runs, ahead=False)
    assert figs["iter_s"] == 60 and figs["run_s"] == 214 and figs["mismatch"] == 0.02
    assert figs["engine_idle"] == 1 - 41 / 60 and figs["trainer_idle"] == 1 - 50 / 60
    ahead = overlap.figures(runs, ahead=True)  # iteration 2 ran iteration 3's generation beside its update
    assert ahead["gen_s"] == 30 and ahead["engine_idle"] == 1 - 31 / 60


def test_the_cost_model_overlaps_generation_with_the_update():
    import importlib.util

    spec = importlib.util.spec_from_file_location("cost_model", HERE.parent / "infra" / "cost_model.py")
    cost = importlib.util.module_from_spec(spec)
    sys.modules["cost_model"] = cost  # its dataclasses look their module up
    spec.loader.exec_module(cost)
    off = cost.one_step_off(gen=6.0, upd=20.0, sync=1.0)
    assert off["t"] == 21.0 and off["trainer_idle"] == 1 / 21 and off["engine_idle"] == 15 / 21
    assert "one-step-off" in cost.report()
