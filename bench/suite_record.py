"""The out-of-domain suite's record: the demo's warm-start on each family of ``configs/suites/ood.yaml``.

The suite is there to read calibration outside the training task, which needs families the model is neither always
right nor always wrong on. This script measures that for the demo's warm-start (SmolLM2-135M-Instruct after the
format warm-start of ``configs/demo.yaml``), through the real command (`rlcr eval --suite … --records …`), and
writes the record the suite is held to (``bench/results/ood-suite/record.json``): each family's accuracy with its
95% bootstrap interval, and whether it lies in the goal band (20–80%).

    .venv/bin/python bench/suite_record.py                          # warm-starts first (`rlcr sft`, ~9 min here)
    .venv/bin/python bench/suite_record.py --checkpoint DIR         # an existing warm-start

Each family's line is printed as the evaluation's table is read; the last line is the headline,
``ood_suite_families_in_band: k/n``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "configs" / "suites" / "ood.yaml"
CONFIG = ROOT / "configs" / "demo.yaml"
OUT = ROOT / "bench" / "results" / "ood-suite" / "record.json"
BAND = (0.2, 0.8)


def suite_digest(path: Path) -> str:
    """The suite's content (what its problems depend on), as a digest the record names: a suite edited after its
    record was measured no longer matches it (tests/test_suite.py)."""
    from rlcr.evaluation.suite import load_suite

    suite = load_suite(path)
    blob = json.dumps({"seed": suite.seed, "n": suite.n, "families": suite.families}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def rlcr(*args: str, cwd: Path) -> str:
    out = subprocess.run([sys.executable, "-m", "rlcr.cli", *args], cwd=cwd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"rlcr {' '.join(args[:2])} failed ({out.returncode}):\n{(out.stdout + out.stderr)[-3000:]}")
    return out.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", help="the warm-start to measure (default: made now with `rlcr sft`)")
    ap.add_argument("--work", help="a folder for the store and the rows (default: a temporary one)")
    ap.add_argument("--out", default=str(OUT))
    a = ap.parse_args()
    work = Path(a.work or tempfile.mkdtemp(prefix="rlcr-suite-record-"))
    work.mkdir(parents=True, exist_ok=True)
    store = f"storage.uri={work / 'store'}"
    t0 = time.perf_counter()
    checkpoint = a.checkpoint
    if checkpoint is None:
        text = rlcr("sft", "--config", str(CONFIG), store, cwd=work)
        checkpoint = re.search(r"warm-started checkpoint: (\S+)", text).group(1)
        print(f"warm-start: {checkpoint} ({time.perf_counter() - t0:.0f} s)", flush=True)
    rows = work / f"ood-{int(time.time())}.parquet"
    t1 = time.perf_counter()
    rlcr("eval", "--config", str(CONFIG), "--checkpoint", checkpoint, "--suite", str(SUITE), "--records", str(rows),
         store, cwd=work)
    eval_s = time.perf_counter() - t1

    import pyarrow.parquet as pq

    from rlcr.evaluation.suite import load_suite, summarize_suite
    from rlcr.rollout.records import provenance, table_to_rows

    table = pq.read_table(rows)
    suite = load_suite(SUITE)
    result = summarize_suite(table_to_rows(table), n_resamples=1000, seed=suite.seed)
    families = {}
    for name, m in result["families"].items():
        low, high = m["ci"]["accuracy"]
        inside = BAND[0] <= m["accuracy"] <= BAND[1]
        families[name] = {"n_problems": m["n_tasks"], "n_answers": m["n_answers"], "accuracy": m["accuracy"],
                          "accuracy_ci95": [low, high], "format_rate": m["format_rate"],
                          "confidence_parse_rate": m["confidence_parse_rate"],
                          "mean_confidence": m.get("mean_confidence"), "ece": m.get("ece"),
                          "in_band": inside}
        print(f"{name}: accuracy {m['accuracy']:.3f} [{low:.3f}, {high:.3f}] over {m['n_tasks']} problems × "
              f"{m['n_answers'] // max(m['n_tasks'], 1)} answers{'' if inside else '  (outside 20-80%)'}",
              flush=True)
    fields = provenance(table, str(rows))
    record = {"suite": suite.name, "suite_file": str(SUITE.relative_to(ROOT)), "suite_digest": suite_digest(SUITE),
              "suite_seed": suite.seed, "n_per_family": suite.n, "band": list(BAND),
              "policy": "the demo's warm-start: SmolLM2-135M-Instruct after `rlcr sft --config configs/demo.yaml`",
              "config": str(CONFIG.relative_to(ROOT)), "method": fields.get("method"),
              "eval_samples": fields.get("eval_samples"), "measured": time.strftime("%Y-%m-%d"),
              "eval_seconds": round(eval_s, 1), "families": families,
              "pooled": {k: result["pooled"].get(k) for k in ("accuracy", "ece", "brier", "auroc", "n_tasks")}
              | {"accuracy_ci95": result["pooled"]["ci"]["accuracy"]}}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"record: {out} (evaluation {eval_s:.0f} s)")
    inside = sum(f["in_band"] for f in families.values())
    print(f"ood_suite_families_in_band: {inside}/{len(families)}")


if __name__ == "__main__":
    main()
