"""A real crash: SIGKILL the flow's process during an update and during a commit, then resume.

Each run is a separate Python process (the flow, its Prefect client and its Ray driver)
that joins the test session's Ray cluster and Prefect server; the kill is a SIGKILL,
not an exception. After the two kills and a final resume, exactly iterations 1 and 2
are committed, each once, no temporaries are left, and each manifest's checkpoint is
the policy the engines evaluated, sealed with the content id the manifest names.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

from rlcr.config import RLCRConfig
from rlcr.runs.store import RunStore

HERE = Path(__file__).parent


def run_flow(env, overrides, run_id, iterations, *kill):
    args = [sys.executable, str(HERE / "kill_flow.py"), json.dumps(overrides), run_id, str(iterations),
            *map(str, kill)]
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=900, cwd=HERE.parent)


def test_sigkill_during_update_and_commit_then_resume(ray_local, prefect_harness, tiny_model_dir, tmp_path):
    import ray
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address,
           "PREFECT_API_URL": PREFECT_API_URL.value(), "PYTHONPATH": str(HERE.parent)}
    store = tmp_path / "store"
    overrides = {
        "model.name": str(tiny_model_dir), "storage.uri": str(store), "rollout.prompts_per_iteration": 2,
        "rollout.num_generations_answer": 2, "rollout.num_generations_confidence": 2, "tasks.num_train": 16,
        "tasks.num_eval": 4, "rollout.temperature": 1.0, "rollout.max_answer_tokens": 16,
        "rollout.max_confidence_tokens": 8, "engine.max_model_len": 512, "engine.kv_cache_gib": 0.25,
        "update.learning_rate": 1e-4, "orchestration.retries": 0, "eval.every": 2,
    }
    run = RunStore.open(RLCRConfig.from_dict(overrides), "killed")

    # killed as iteration 2's update starts (delay 0 blocks the stage until the kill: the update itself now takes
    # well under a second, so a timed kill would land after the commit)
    a = run_flow(env, overrides, "killed", 2, "update", 2, 0)
    assert a.returncode == -9, a.stdout + a.stderr
    assert "KILL update@2" in a.stdout + a.stderr
    assert [m["iteration"] for m in run.committed()] == [1], (a.stdout + a.stderr)[-6000:]

    b = run_flow(env, overrides, "killed", 2, "commit", 2, 0)  # resumes at 2, killed as it commits
    assert b.returncode == -9, b.stdout + b.stderr
    assert "KILL commit@2" in b.stdout + b.stderr
    assert [m["iteration"] for m in run.committed()] == [1]
    m1_before = run.manifest(1)

    c = run_flow(env, overrides, "killed", 2)  # resumes at 2 and finishes
    assert c.returncode == 0, c.stdout + c.stderr
    summary = json.loads(c.stdout.split("SUMMARY", 1)[1])
    assert summary["iterations"] == [2]
    manifests = run.committed()
    assert [m["iteration"] for m in manifests] == [1, 2]
    assert run.manifest(1) == m1_before  # never rewritten
    assert not run.store.exists(run.manifest_rel(3))
    for m in manifests:
        metrics = run.store.read_json(run.store.rel(m["metrics_uri"]))
        assert metrics["engines"]["policy"] == m["checkpoint_uri"]  # evaluated = committed (in memory, then saved)
        assert run.store.content_id(run.store.rel(m["checkpoint_uri"])) == m["state_content_id"]
    assert manifests[1]["policy_in"] == manifests[0]["checkpoint_uri"]
    # the run's MLflow record (local SQLite beside the store): one run, one value per step for every metric,
    # although iteration 2 was run three times (killed in its update, killed as it committed, then finished)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{store}/mlflow.db")
    tracked = client.search_runs([client.get_experiment_by_name("rlcr").experiment_id],
                                 filter_string="tags.`rlcr.run_id` = 'killed'")
    assert len(tracked) == 1
    history = {key: sorted(m.step for m in client.get_metric_history(tracked[0].info.run_id, key))
               for key in ("rlcr/iteration", "rollout/answer/reward_mean", "timings/update_s", "eval/accuracy")}
    assert history == {"rlcr/iteration": [0, 1, 2], "rollout/answer/reward_mean": [1, 2],
                       "timings/update_s": [1, 2], "eval/accuracy": [0, 2]}, history
    leftovers = [p for p in store.rglob("*") if ".tmp-" in p.name]
    assert leftovers == []
    assert not run.store.exists(run.lease_rel)  # released by the run that finished
