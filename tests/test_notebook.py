"""notebooks/explore.ipynb executes (nbclient) against a run written through the real code paths:
rollout records → Parquet, metrics.json, baseline.json, sealed checkpoints + manifests, and a probe
report from the tiny model with vLLM; once from a local store and once from S3 (moto server)."""

import socket
from pathlib import Path

import pytest

from rlcr.config import RLCRConfig
from rlcr.evaluation.evaluate import summarize_eval
from rlcr.probe.probe import probe_checkpoint
from rlcr.probe.report import latest_report, write_report
from rlcr.rollout.pipeline import rollout_stats
from rlcr.rollout.records import (
    ANSWER,
    CONFIDENCE,
    answer_scores,
    assign_advantages,
    confidence_scores,
    rollout_row,
    rows_to_table,
)
from rlcr.runs.store import RunStore
from rlcr.storage import Store
from rlcr.tasks.countdown import generate_tasks

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "explore.ipynb"
RUN = "nb-run"


def iteration_rows(tasks, iteration, conf_right, conf_wrong):
    """A 2-answer × 2-confidence rollout tree per task: one right and one wrong answer (production row builder)."""
    rows = []
    for j, t in enumerate(tasks):
        answers = [f"<think>Try {t.solution}.</think>\n<answer>{t.solution}</answer>",
                   "<think>Guess.</think>\n<answer>1 + 1</answer>"]
        confidences = [[f"<confidence>{conf_right}</confidence>", "<confidence>0.5</confidence>"],
                       [f"<confidence>{conf_wrong}</confidence>", "no idea"]]
        for k, text in enumerate(answers):
            scores = answer_scores(text, t, format_score=0.1, task_name="countdown")
            rows.append(rollout_row(ANSWER, task=t, prompt_id=j, answer_id=k, context_text="ctx", context_ids=[1, 2],
                                    completion_text=text, completion_ids=[3] * (k + 1),
                                    completion_logprobs=[-0.5] * (k + 1), run_id=RUN, iteration=iteration, **scores,
                                    task_name="countdown"))
            for h, ctext in enumerate(confidences[k]):
                rows.append(rollout_row(CONFIDENCE, task=t, prompt_id=j, answer_id=k, confidence_id=h,
                                        context_text="ctx", context_ids=[1, 2], completion_text=ctext,
                                        completion_ids=[3] * (h + 1), completion_logprobs=[-0.5] * (h + 1),
                                        run_id=RUN, iteration=iteration, correct=scores["correct"],
                                        **confidence_scores(ctext, scores["correct"]), task_name="countdown"))
    return assign_advantages(rows)


@pytest.fixture(scope="module")
def run_store(tiny_model_dir, tmp_path_factory):
    """A two-iteration run with rollouts, metrics, baseline, checkpoints and a real probe report."""
    store = Store(str(tmp_path_factory.mktemp("nb-store")))
    cfg = RLCRConfig(model={"name": str(tiny_model_dir)}, storage={"uri": store.uri},
                     rollout={"temperature": 1.0, "max_answer_tokens": 24, "max_confidence_tokens": 12},
                     engine={"max_model_len": 512, "kv_cache_gib": 0.25}, run={"seed": 5})
    run = RunStore(store, RUN)
    tasks = generate_tasks(3, seed=21)
    store.write_json(f"{run.prefix}/baseline.json",
                     {"policy_uri": str(tiny_model_dir), "eval": summarize_eval(iteration_rows(tasks, 0, 0.5, 0.5))})
    for k, (right, wrong) in enumerate([(0.6, 0.5), (0.9, 0.2)], start=1):
        rows = iteration_rows(tasks, k, right, wrong)
        it = run.iteration_dir(k)
        rollouts_uri = store.write_parquet(f"{it}/rollouts/rollouts.parquet", rows_to_table(rows))
        ckpt = store.put_dir(tiny_model_dir, f"{it}/checkpoint")
        metrics = {"rollout": rollout_stats(rows), "update": {"loss": 0.1 / k, "grad_norm": 1.0},
                   "eval": summarize_eval(rows), "timings": {"rollouts_s": 1.0}}
        store.write_json(f"{it}/metrics.json", metrics)
        run.commit(k, {"checkpoint_uri": ckpt, "rollouts_uri": rollouts_uri,
                       "metrics_uri": store.url(f"{it}/metrics.json"), "config_hash": cfg.config_hash()})
    ckpt = run.last_committed()["checkpoint_uri"]
    report = probe_checkpoint(cfg, ckpt, generate_tasks(2, seed=9), samples=3)
    report["iteration"] = 2
    report["suite"] = suite_result()
    write_report(store, RUN, report)
    return store


def suite_result() -> dict:
    """What a probe with an evaluation suite adds to its report: two families' figures and the pool's."""
    from rlcr.evaluation.suite import summarize_suite

    rows = []
    for pid, (family, correct, conf) in enumerate([("syllogism", 1.0, 0.8), ("syllogism", 0.0, 0.6),
                                                    ("gcd", 1.0, 0.3), ("gcd", 0.0, 0.2), ("gcd", 1.0, 0.7)]):
        base = {"prompt_id": pid, "answer_id": 0, "dataset": family, "correct": correct, "question": f"q{pid}",
                "answer": "1", "settings": "{}", "gen_seed": 1, "gen_index": pid, "instruction": "i",
                "scorer_timeout_s": 5.0, "task_name": "reasoning_gym"}
        rows += [{**base, "sample_type": "answer", "score": correct},
                 {**base, "sample_type": "confidence", "confidence_id": 0, "confidence": conf, "score": 0.0}]
    return {"suite": "ood", "suite_seed": 7301, "n": 2, **summarize_suite(rows, n_resamples=100)}


def execute(params: dict, cwd: Path):
    import nbclient
    import nbformat

    nb = nbformat.read(NOTEBOOK, as_version=4)
    first = next(c for c in nb.cells if c.cell_type == "code")
    first.source = "\n".join(f"{k} = {v!r}" for k, v in params.items())
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(cwd)}}).execute()
    return nb


def outputs(nb):
    texts = ""
    n_images = 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            assert out.output_type != "error", out
            data = out.get("data", {})
            n_images += "image/png" in data
            texts += out.get("text", "") + data.get("text/plain", "") + data.get("text/html", "")
    return n_images, texts


def test_notebook_runs_on_a_local_run(run_store, tmp_path):
    ts, _ = latest_report(run_store, RUN)
    nb = execute({"STORAGE_URI": run_store.uri, "RUN_ID": RUN, "S3_ENDPOINT_URL": None}, tmp_path)
    n_images, text = outputs(nb)
    assert n_images == 4  # training curves, rollouts, probe, the suite's families
    assert f"run '{RUN}'" in text and "2 committed iteration(s)" in text
    assert "syllogism" in text and "pooled" in text  # the suite's table beside its figure
    assert "iteration 2: 18 samples" in text  # 3 prompts × 2 answers × (1 + 2 confidences)
    assert f"report {ts}: iteration 2" in text and "report.html" in text
    # RUN_ID = None: the run committed most recently
    nb = execute({"STORAGE_URI": run_store.uri, "RUN_ID": None, "S3_ENDPOINT_URL": None}, tmp_path)
    assert f"run '{RUN}'" in outputs(nb)[1]


def test_notebook_runs_on_s3(run_store, tmp_path, monkeypatch):
    import boto3
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)  # the kernel inherits them
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket="rlcr-nb")
        root = Path(run_store.uri)
        for path in root.rglob("*"):
            if path.is_file() and "checkpoint" not in path.parts:
                client.upload_file(str(path), "rlcr-nb", f"store/{path.relative_to(root).as_posix()}")
        nb = execute({"STORAGE_URI": "s3://rlcr-nb/store", "RUN_ID": RUN, "S3_ENDPOINT_URL": endpoint}, tmp_path)
        n_images, text = outputs(nb)
        assert n_images == 4 and "s3://rlcr-nb/store/runs/nb-run" in text and "report.html" in text
    finally:
        server.stop()


def test_notebook_opens_the_demos_run_with_no_edits(run_store, tmp_path):
    """The notebook's own parameters (``./runs-store``, the newest run), opened from ``notebooks/`` of a
    checkout where the demo wrote its store at the root, as ``make demo`` does (the config default)."""
    import nbformat

    repo = tmp_path / "checkout"
    (repo / "notebooks").mkdir(parents=True)
    (repo / "runs-store").symlink_to(run_store.uri, target_is_directory=True)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    params = next(c for c in nb.cells if c.cell_type == "code").source
    assert 'STORAGE_URI = os.environ.get("STORE") or "./runs-store"' in params
    assert 'RUN_ID = os.environ.get("RUN") or None' in params
    out = execute({"STORAGE_URI": "./runs-store", "RUN_ID": None, "S3_ENDPOINT_URL": None}, repo / "notebooks")
    assert f"run '{RUN}'" in outputs(out)[1]


def test_the_notebook_takes_its_run_from_the_environment(run_store, tmp_path, monkeypatch):
    """`make notebook RUN=… STORE=…`: the notebook's own parameter cell (not replaced) reads the run and the store
    from the environment, so a newcomer edits nothing; the Makefile target executes it with nbconvert."""
    import subprocess

    import nbclient
    import nbformat

    monkeypatch.setenv("STORE", run_store.uri)
    monkeypatch.setenv("RUN", RUN)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()  # the kernel inherits them
    assert f"run '{RUN}'" in outputs(nb)[1]
    root = NOTEBOOK.parents[1]
    dry = subprocess.run(["make", "-n", "-B", "notebook", "RUN=first", "STORE=s3://b/p", "VENV=/nonexistent-venv"],
                         cwd=root, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert "--no-deps -r requirements/cpu-notebook.txt" in dry.stdout or "--no-deps -r requirements/gpu-notebook.txt" \
        in dry.stdout  # installs what the notebook needs: its lock (docs/development.md)
    assert ('RUN="first" STORE="s3://b/p" /nonexistent-venv/bin/jupyter nbconvert --to html --execute '
            "notebooks/explore.ipynb --output explore-first") in dry.stdout
