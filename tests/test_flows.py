"""The `rlcr` Prefect flow end to end: S3 (moto server on 127.0.0.1), local Ray, real vLLM, tiny model.

One run is driven through failure, resume and an S3 outage:
  A. iterations=2, update of iteration 2 fails  → iteration 1 committed, 2 not
  B. same run_id                                → resumes at 2, exactly 2 committed, artifacts created
  C. iterations=3, S3 endpoint stops mid-run    → the flow fails clearly, 1 and 2 stay committed
"""

import io
import json
import re

import pyarrow.parquet as pq
import pytest

import flow_hooks
from s3server import BUCKET


@pytest.fixture
def stage_hook():
    """``flow_hooks.hook`` subscribed to the flow's stage events: tests inject failures per (stage, iteration)."""
    from rlcr import events

    flow_hooks.ACTIONS.clear()
    flow_hooks.SEEN.clear()
    with events.subscribed(flow_hooks.hook):
        yield flow_hooks
    flow_hooks.ACTIONS.clear()


def overrides(tiny_model_dir, s3):
    return {
        "model.name": str(tiny_model_dir), "storage.uri": f"s3://{BUCKET}/exp", "storage.s3_endpoint_url": s3.endpoint,
        "rollout.prompts_per_iteration": 2, "rollout.num_generations_answer": 3,
        "rollout.num_generations_confidence": 2, "tasks.num_train": 16, "tasks.num_eval": 4, "rollout.temperature": 1.0,
        "rollout.max_answer_tokens": 16, "rollout.max_confidence_tokens": 8, "engine.max_model_len": 512,
        "engine.kv_cache_gib": 0.25, "update.learning_rate": 1e-4, "orchestration.retries": 1,
        "orchestration.retry_delay_s": 0.5,
    }


def test_train_flow_fail_resume_and_s3_outage(ray_local, prefect_harness, tiny_model_dir, s3, stage_hook):
    from flows.train import artifact_key, rlcr_train

    run = "lr=1e-4 exp_1"  # any valid run id works end to end (S3 keys, Prefect artifact keys)
    prefix = f"exp/runs/{run}/"
    # A: iteration 2's update fails (every retry)
    stage_hook.ACTIONS[("update", 2)] = RuntimeError("injected update failure")
    with pytest.raises(RuntimeError, match="injected update failure"):
        rlcr_train(overrides=overrides(tiny_model_dir, s3), run_id=run, iterations=2)
    from rlcr.config import RLCRConfig
    from rlcr.runs.store import RunStore

    def key(uri):  # a manifest's URI → its S3 key
        return uri.removeprefix(f"s3://{BUCKET}/")

    keys = s3.keys(prefix)
    assert f"{prefix}iter-0001/manifest.json" in keys
    ckpt1 = key(RunStore.open(RLCRConfig.from_dict(overrides(tiny_model_dir, s3)), run).manifest(1)["checkpoint_uri"])
    assert re.fullmatch(rf"{re.escape(prefix)}iter-0001/attempt-[0-9a-f]{{12}}/checkpoint", ckpt1)
    assert f"{ckpt1}/_COMPLETE" in keys and f"{ckpt1}/model.safetensors" in keys
    assert f"{prefix}iter-0002/manifest.json" not in keys
    stale = [k for k in keys if re.fullmatch(rf"{re.escape(prefix)}iter-0002/attempt-\w+/rollouts/rollouts.parquet", k)]
    assert len(stale) == 1  # an uncommitted attempt, ignored on resume
    assert stage_hook.SEEN.count(("update", 2)) == 2  # first try + 1 retry

    # B: resume with the same run_id
    stage_hook.ACTIONS.clear()
    stage_hook.SEEN.clear()
    summary = rlcr_train(overrides=overrides(tiny_model_dir, s3), run_id=run, iterations=2)
    assert summary["iterations"] == [2]
    assert ("rollouts", 1) not in stage_hook.SEEN and ("rollouts", 2) in stage_hook.SEEN
    keys = s3.keys(prefix)
    manifests = [k for k in keys if k.endswith("manifest.json")]
    assert manifests == [f"{prefix}iter-0001/manifest.json", f"{prefix}iter-0002/manifest.json"]

    def body(k):
        return s3.client().get_object(Bucket=BUCKET, Key=k)["Body"].read()

    raw1, raw2 = (json.loads(body(k)) for k in manifests)
    # recorded relative to the run (a store may move), under the attempt (lease) that committed it
    assert (raw2["checkpoint_uri"] == f"iter-0002/attempt-{raw2['attempt']}/checkpoint"
            and raw2["attempt"] != raw1["attempt"])
    assert f"{prefix}{raw2['rollouts_uri']}" not in stale  # the failed attempt's rollouts are not the committed ones

    m1, m2 = RunStore.open(RLCRConfig.from_dict(overrides(tiny_model_dir, s3)), run).committed()
    assert m2["policy_in"] == m1["checkpoint_uri"] and m2["checkpoint_uri"].startswith(f"s3://{BUCKET}/{prefix}iter-0002/")
    for m in (m1, m2):
        it = f"{prefix}iter-{m['iteration']:04d}/attempt-{m['attempt']}/"  # every artifact under its attempt
        assert [key(m[f]) for f in ("checkpoint_uri", "rollouts_uri", "metrics_uri", "records_uri")] == [
            f"{it}checkpoint", f"{it}rollouts/rollouts.parquet", f"{it}metrics.json", f"{it}eval.parquet"]
        assert {f"{it}checkpoint/_COMPLETE", f"{it}rollouts/rollouts.parquet", f"{it}metrics.json"} <= set(keys)
        metrics = json.loads(body(key(m["metrics_uri"])))
        assert {"rollout", "update", "eval", "timings"} <= set(metrics)
        assert metrics["timings"]["save_s"] > 0  # a saving iteration's metrics include the save's time
        assert 0.0 <= metrics["eval"]["accuracy"] <= 1.0
        assert metrics["engines"]["policy"] == m["checkpoint_uri"]  # the version label is the saved checkpoint
        # the evaluation's per-answer rows are kept beside it, for paired comparisons (`rlcr compare`)
        assert metrics["eval"]["records_uri"] == m["records_uri"] == f"s3://{BUCKET}/{it}eval.parquet"
        records = pq.read_table(io.BytesIO(body(key(m["records_uri"])))).to_pylist()
        assert sum(r["sample_type"] == "answer" for r in records) == metrics["eval"]["n_answers"]
        assert {r["run_id"] for r in records} == {run} and {r["iteration"] for r in records} == {m["iteration"]}
    baseline = json.loads(body(f"{prefix}baseline.json"))
    assert re.fullmatch(rf"{re.escape(prefix)}iter-0000/attempt-\w+/eval.parquet", key(baseline["eval"]["records_uri"]))
    assert key(baseline["eval"]["records_uri"]) in keys
    from prefect.artifacts import Artifact

    for k in (1, 2):
        art = Artifact.get(key=artifact_key(run, k))
        assert art is not None and "held-out ECE" in art.data and "checkpoint" in art.data

    # C: the S3 endpoint goes away during iteration 3; committed iterations are not lost
    stage_hook.ACTIONS[("update", 3)] = s3.stop
    with pytest.raises(Exception) as err:
        rlcr_train(overrides=overrides(tiny_model_dir, s3), run_id=run, iterations=3)
    assert f"127.0.0.1:{s3.port}" in str(err.value), err.value  # the error names the unreachable endpoint
    s3.start()
    keys = s3.keys(prefix)
    assert [k for k in keys if k.endswith("manifest.json")] == manifests
    assert not [k for k in keys if k.startswith(f"{prefix}iter-0003/") and k.endswith("/checkpoint/_COMPLETE")]


def test_invalid_config_fails_before_any_work(prefect_harness, tmp_path):
    from flows.train import rlcr_train
    from rlcr.config import ConfigError

    with pytest.raises(ConfigError, match="rollout.num_generations_confidence"):
        rlcr_train(overrides={"rollout.num_generations_confidence": 1, "storage.uri": str(tmp_path / "store")},
                   run_id="bad")
    assert not (tmp_path / "store").exists()


def test_resume_refuses_a_changed_config(prefect_harness, tmp_path):
    from flows.train import rlcr_train
    from rlcr.config import RLCRConfig
    from rlcr.runs.store import RunConfigMismatch, RunStore

    cfg = RLCRConfig(storage={"uri": str(tmp_path)}, model={"name": "unused"})
    RunStore.open(cfg, "r").check_config(cfg)
    with pytest.raises(RunConfigMismatch, match="method.lambda_conf"):
        rlcr_train(overrides={"storage.uri": str(tmp_path), "model.name": "unused", "method.lambda_conf": 0.5},
                   run_id="r")


def test_artifact_keys_follow_prefects_rule_and_stay_distinct():
    import re

    from flows.train import artifact_key

    ids = ["lr=1e-5", "lr-1e-5", "exp 1", "Exp_1", "a.b", "run-20261123-120000-ab12cd"]
    keys = [artifact_key(i, 3) for i in ids]
    assert all(re.fullmatch(r"[a-z0-9-]+", k) for k in keys)
    assert len(set(keys)) == len(keys)


def test_progress_line_shows_held_out_figures_or_says_it_has_none():
    from rlcr.ui.presentation import progress_line

    assert progress_line({"eval": {"accuracy": 0.25, "ece": 0.125}, "rollout": {"answer/accuracy": 0.5}}) == \
        "held-out accuracy 0.25, ECE 0.125"
    line = progress_line({"eval": {}, "rollout": {"answer/accuracy": 0.375, "confidence/mean": 0.5}})
    assert line == "rollout accuracy 0.375, mean confidence 0.5 (no held-out evaluation this iteration)"
    assert "nan" not in progress_line({"eval": {}, "rollout": {"answer/accuracy": 0.5}})  # rlvr: no confidences


@pytest.mark.parametrize("bad", ["../../x", "a/b", ".."])
def test_escaping_run_id_fails_before_any_work(prefect_harness, tmp_path, bad):
    from flows.train import rlcr_train
    from rlcr.config import ConfigError

    store = tmp_path / "deep" / "store"
    with pytest.raises(ConfigError, match="invalid run id"):
        rlcr_train(overrides={"storage.uri": str(store), "model.name": "unused"}, run_id=bad)
    assert not any(tmp_path.rglob("*.json")) and not store.exists()


def test_second_writer_on_a_run_fails_within_seconds(prefect_harness, tmp_path):
    import time

    from flows.train import rlcr_train
    from rlcr.config import RLCRConfig
    from rlcr.runs.store import RunLease, RunLocked, RunStore

    cfg = RLCRConfig(storage={"uri": str(tmp_path)}, model={"name": "unused"})
    run = RunStore.open(cfg, "shared")
    with RunLease(run, owner="the first flow"):
        t0 = time.monotonic()
        with pytest.raises(RunLocked, match="the first flow"):
            rlcr_train(overrides={"storage.uri": str(tmp_path), "model.name": "unused"}, run_id="shared")
        assert time.monotonic() - t0 < 30
    assert not run.store.exists(run.config_rel)  # the second writer wrote nothing


def test_a_run_that_cannot_fit_the_cluster_fails_fast(ray_local, prefect_harness, tiny_model_dir, tmp_path):
    """Engines are kept during the update: 2 engines + 4 trainer workers do not fit 4 CPUs; fail, don't wait."""
    import time

    from flows.train import rlcr_train
    from rlcr.runs.cluster import ResourceError

    t0 = time.monotonic()
    with pytest.raises(ResourceError, match=r"update phase needs 5 CPU but the cluster has 4") as err:
        rlcr_train(overrides={"storage.uri": str(tmp_path), "model.name": str(tiny_model_dir), "update.num_workers": 4,
                              "rollout.actors": 2, "tasks.num_train": 16, "tasks.num_eval": 4}, run_id="big")
    assert "update.num_workers" in str(err.value)
    assert time.monotonic() - t0 < 60


def test_an_update_that_cannot_fit_fails_fast(ray_local, tiny_model_dir, tmp_path):
    """`rlcr sft` or any update on its own: 8 trainer workers on a 4-CPU cluster fail at once, not wait."""
    import time

    from rlcr.config import RLCRConfig
    from rlcr.runs.cluster import ResourceError
    from rlcr.train.trainer import run_update

    cfg = RLCRConfig(model={"name": str(tiny_model_dir)}, storage={"uri": str(tmp_path)}, update={"num_workers": 8})
    t0 = time.monotonic()
    with pytest.raises(ResourceError, match="8 worker"):
        run_update(cfg, [{"row": 0}], policy_uri=str(tiny_model_dir), run_id="big", iteration=1)
    assert time.monotonic() - t0 < 60


def test_save_every_stages_rewinds_and_resumes_exactly(ray_local, prefect_harness, tiny_model_dir, tmp_path,
                                                        stage_hook):
    """``save_every: 2``. An uninterrupted 3-iteration run that waits for each save
    (``orchestration.background_save: false``), against runs that save in the background: one whose trainer
    worker is SIGKILLed as it is about to save iteration 2 (two unsaved updates are lost: the flow rewinds to
    the start and re-runs 1 and 2), one whose worker is SIGKILLed after the background save of iteration 2
    started and before it was committed (the same rewind), each then resumed from its saved state for
    iteration 3: same rollouts, same weights. Iteration 1 is committed only with the state saved after 2,
    which its manifest names. The background-save run keeps one checkpoint (``orchestration.keep_checkpoints``):
    iteration 2's is deleted once iteration 3's save is committed."""
    import os
    import signal

    import pyarrow.parquet as pq
    from safetensors.torch import load_file

    from flows.train import rlcr_train
    from rlcr.config import RLCRConfig
    from rlcr.runs.store import RunStore

    def cfg_for(name):
        return {"model.name": str(tiny_model_dir), "storage.uri": str(tmp_path / name),
                "rollout.prompts_per_iteration": 2, "rollout.num_generations_answer": 2,
                "rollout.num_generations_confidence": 2, "tasks.num_train": 16, "tasks.num_eval": 4,
                "rollout.temperature": 1.0, "rollout.max_answer_tokens": 16, "rollout.max_confidence_tokens": 8,
                "engine.max_model_len": 512, "engine.kv_cache_gib": 0.25, "update.learning_rate": 1e-3,
                "orchestration.retries": 1, "orchestration.retry_delay_s": 0.1, "eval.every": 0,
                "orchestration.save_every": 2, "orchestration.background_save": name != "a",
                "orchestration.keep_checkpoints": 1 if name == "c" else None}

    straight = RunStore.open(RLCRConfig.from_dict(cfg_for("a")), "r")
    rlcr_train(overrides=cfg_for("a"), run_id="r", iterations=3)
    assert ("saved", 2) not in stage_hook.SEEN  # the flow waited for its saves
    m1, m2, m3 = straight.committed()
    assert m1["checkpoint_uri"] is None and m1["state_uri"] == m2["checkpoint_uri"] and m1["state_iteration"] == 2
    a = m1["attempt"]  # one flow run: one attempt
    assert m2["attempt"] == m3["attempt"] == a and m2["checkpoint_uri"].endswith(f"iter-0002/attempt-{a}/checkpoint")
    assert m3["checkpoint_uri"].endswith(f"iter-0003/attempt-{a}/checkpoint")
    # policy_in names a state that exists: the initial model + iteration 1 applied in memory, for iteration 2
    # the initial model is the store's copy of the plain model directory, named by its content (docs/models.md)
    initial = m1["policy_in"]
    assert initial.startswith(straight.store.url("models/")) and straight.store.is_complete(straight.store.rel(initial))
    assert m2["policy_in"] == initial and m2["policy_in_updates"] == [1]
    assert m3["policy_in"] == m2["checkpoint_uri"] and m3["policy_in_updates"] == [] and m1["policy_out"] is None
    assert not straight.store.exists(straight.checkpoint_rel(1, a))  # nothing saved after iteration 1
    assert straight.pending() == [] and not straight.store.exists(straight.pending_rel(1, a))

    for name, stage in (("b", "save"), ("c", "saved")):
        crashed = RunStore.open(RLCRConfig.from_dict(cfg_for(name)), "r")
        killed = []

        def kill_trainer_worker(crashed=crashed, killed=killed):  # once: the save's retry emits its start again
            if killed:
                return
            assert crashed.pending() == [1, 2]  # staged, not committed
            assert crashed.committed() == []
            pid = crashed.metrics(2)["update"]["workers"][0]["pid"]  # staged: the lease holder's draft names it
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

        stage_hook.ACTIONS.clear()
        stage_hook.ACTIONS[(stage, 2)] = kill_trainer_worker
        stage_hook.SEEN.clear()
        # b: 2 iterations, then a resume; c: 3 iterations (the run's last save is waited for, so iteration 2's is
        # in the background only when a third follows: it is settled, and the worker killed, in iteration 3)
        summary = rlcr_train(overrides=cfg_for(name), run_id="r", iterations=2 if name == "b" else 3)
        assert killed and summary["iterations"] == ([1, 2] if name == "b" else [1, 2, 3]), name
        assert stage_hook.SEEN.count(("rollouts", 1)) == 2 and stage_hook.SEEN.count(("update", 2)) == 2  # rewound
        stage_hook.ACTIONS.clear()
        if name == "b":
            rlcr_train(overrides=cfg_for(name), run_id="r", iterations=3)  # resume: a new trainer from the saved state
        n1, n2, n3 = crashed.committed()
        assert n3["policy_in"] == n2["checkpoint_uri"] and n1["state_uri"] == n2["checkpoint_uri"]
        assert crashed.metrics(3)["update"]["trainer_starts"] == (1 if name == "b" else 2)  # c: restarted by the rewind
        assert crashed.metrics(3)["timings"]["save_s"] > 0
        if name == "c":  # a background save's write time is in the metrics of the iteration it saved
            assert crashed.metrics(2)["timings"]["save_write_s"] > 0

        for a, b in ((m1, n1), (m2, n2), (m3, n3)):
            ra, rb = (pq.read_table(m["rollouts_uri"]).column("completion_ids").to_pylist() for m in (a, b))
            assert ra == rb, (name, a["iteration"])  # same weights in the engines → same rollouts
        for a, b in ((m2, n2), (m3, n3)):
            if name == "c" and b is n2:  # keep_checkpoints 1: deleted once 3's save was committed; 3 resumes
                assert not crashed.store.exists(crashed.store.rel(n2["checkpoint_uri"]))
                assert crashed.verified_state(n3) == n3["checkpoint_uri"]
                continue
            wa, wb = (load_file(f"{m['checkpoint_uri']}/model.safetensors") for m in (a, b))
            assert all(torch_equal(wa[k], wb[k]) for k in wa), (name, a["iteration"])


def torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a, b))
