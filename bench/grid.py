"""The methods grid of the pre-registered protocol (issue 35): exactly what bench/protocol.yaml says, and the
pre-registered table from its records.

    python bench/grid.py --protocol bench/protocol.yaml [--seeds 1,2,3] [--methods rlcr,rlvr,rlcr_single]
                         [--store DIR] [--records DIR] [--chunk 5]
    python bench/grid.py --protocol bench/protocol.yaml --table-only [--docs docs/results.md]
                         [--readme README.md]
    python bench/grid.py --protocol bench/protocol-2.yaml [--seeds 4] [--methods rlvr_g4] [--store DIR]
    python bench/grid.py --protocol bench/protocol-2.yaml --table-only [--docs docs/results.md]

The addendum (a file that ``amends:`` a protocol, bench/protocol-2.yaml) runs and tabulates through
bench/grid_addendum.py and bench/grid_addendum_table.py; the steps below are the protocol's.

1. The protocol file is read and checked (:func:`bench.grid_protocol.load_protocol`; a bad field is one line).
2. The fixed split from ``tasks.split_seed`` (training pool, test, calibration) is written into the store as
   task files (``<store>/grid-split/{train,test,calibration}.jsonl``); every run reads its training pool from
   ``tasks.train_file`` and its held-out set from ``tasks.eval_file``, so a training seed changes only sampling,
   the order of the training tasks and the warm-start. Before any training, every seed's warm-start tasks and
   the split are checked disjoint by task identity; a violation stops the grid.
3. Per seed (``run.seed``): its own warm-start (``grid-s<seed>-sft``, from the training pool only), its own
   equal-token group sizes for all the protocol's methods (one calibration rollout, as bench/methods.py; kept
   with the records as ``s<seed>-plan.json``, committed, so a later session's runs of that seed use the same
   sizes), then the methods' runs (``grid-s<seed>-<method>``) to the protocol's iteration, ``--chunk``
   iterations per `rlcr/train` flow run (resumable: a re-run continues), no intermediate evaluation; only
   each run's newest checkpoint is kept (``orchestration.keep_checkpoints=1``, operational: the protocol
   evaluates the last one only; a run's intermediate saves would take 1.6 GB each).
   A seed can be spread over sessions, a method (``--methods``) at a time: the store need not survive, the
   warm-start is trained again from the same seed, and every record names the sha256 of the warm-start
   weights its policy started from, so the table says whether a seed's policies share one (it differs in the
   bits only if a session ran on another CPU) and, where they do not, which records came from which.
4. The evaluations of the protocol — test and calibration split, primary (sampling at the training temperature,
   ``answers_per_task`` answers, draw 0) and paper protocol (greedy, 1 answer) — of the warm-start (with the
   two-turn confidence query) and of each method's last checkpoint, each written as a small Parquet record
   under ``bench/results/grid/`` (bench/grid_records.py). An evaluation whose record exists is not redone.
5. ``--table-only`` reads the records alone and prints the pre-registered table (bench/grid_table.py),
   ``--docs FILE`` also writes it into FILE's grid section and ``--readme FILE`` its short form (the primary
   protocol's headline metrics, the goals' verdicts) into FILE's grid summary. The last line is
   ``grid goals met: …``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench.grid_protocol import ProtocolError, SplitError, load_protocol  # noqa: E402
from bench.grid_records import DEFAULT_DIR, RecordError  # noqa: E402
from bench.grid_runs import prepare_split, run_seed  # noqa: E402
from bench.grid_table import BEGIN, END, README_BEGIN, README_END, build_table, replace_section  # noqa: E402


def table(protocol, records: Path, docs: str | None, resamples: int | None, readme: str | None = None) -> None:
    """The pre-registered table from the records alone; ``docs``: also written into that file's grid section,
    ``readme``: the short form into that file's grid summary."""
    built = build_table(records, protocol, n_resamples=resamples)
    print(built.docs)
    for path, text, markers in ((docs, built.docs, (BEGIN, END)), (readme, built.summary, (README_BEGIN, README_END))):
        if path:
            Path(path).write_text(replace_section(Path(path).read_text(), text, *markers))
            print(f"written into {path}")
    print(f"grid goals met: {built.headline}")


def _list(ap, text: str | None, allowed, what: str, cast=str) -> list:
    if text is None:
        return list(allowed)
    try:
        out = [cast(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--{what}: a comma-separated list, got {text!r}")
    unknown = [x for x in out if x not in allowed]
    if unknown or not out:
        ap.error(f"--{what}: {unknown[0] if unknown else 'nothing'} is not one of the protocol's "
                 f"({', '.join(map(str, allowed))})")
    return out


def is_addendum(path: str) -> bool:
    """Whether ``path`` is an addendum to a protocol (it names the protocol it ``amends``)."""
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 16).decode("utf-8", "replace")
    except OSError:
        return False
    return any(line.startswith("amends:") for line in head.splitlines())


def store_and_split(ap, protocol, store_arg: str | None, seeds, chunk: int):
    """The grid's local store (``--store``, else the config's) with the protocol's split written into it and
    checked for ``seeds`` (:func:`prepare_split`); returns (store, files, split). A remote store is refused."""
    from rlcr.config import load_config

    cfg = load_config(protocol.config,
                      [*protocol.overrides("rlcr"), *([f"storage.uri={store_arg}"] if store_arg else [])])
    if "://" in cfg.storage.uri:
        ap.error(f"--store: a local directory (the split's task files go there), got {cfg.storage.uri}")
    store = Path(cfg.storage.uri).resolve()
    try:
        files, split = prepare_split(protocol, cfg, store, seeds, chunk)
    except (SplitError, ValueError) as e:
        raise SystemExit(f"split: {e}") from None
    print(f"split: {len(split.train)} training, {len(split.test)} test, {len(split.calibration)} calibration tasks "
          f"(split_seed {protocol.split_seed}); disjoint for seeds {', '.join(map(str, seeds))}", flush=True)
    return store, files, split


def addendum_main(ap, a) -> None:
    """The addendum's runs (bench/grid_addendum.py): its seeds, its policies, its records directory."""
    from bench.grid_addendum import ADDENDUM_DIR, TRAINED, run_addendum_seed
    from bench.grid_protocol import load_addendum

    try:
        addendum = load_addendum(a.protocol)
    except ProtocolError as e:
        ap.error(str(e))
    records = ADDENDUM_DIR if a.records == str(DEFAULT_DIR) else Path(a.records)
    if a.table_only:
        from bench.grid_addendum_table import BEGIN as A_BEGIN, END as A_END, build_addendum_table

        try:
            built = build_addendum_table(addendum, DEFAULT_DIR, records, n_resamples=a.resamples)
        except (RecordError, ValueError) as e:
            ap.error(str(e))
        print(built.docs)
        if a.docs:
            Path(a.docs).write_text(replace_section(Path(a.docs).read_text(), built.docs, A_BEGIN, A_END))
            print(f"written into {a.docs}")
        print(f"addendum goals met: {built.headline}")
        return
    if a.chunk < 1:
        ap.error("--chunk must be >= 1")
    seeds = _list(ap, a.seeds, addendum.seeds, "seeds", int)
    methods = _list(ap, a.methods, list(TRAINED), "methods")
    t0 = time.perf_counter()
    store, files, split = store_and_split(ap, addendum.base, a.store, addendum.seeds, a.chunk)
    for seed in seeds:
        run_addendum_seed(addendum, files, split, store, seed, methods, a.chunk, records)
    print(f"addendum: seeds {', '.join(map(str, seeds))} done in {(time.perf_counter() - t0) / 3600:.2f} h", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--protocol", required=True, help="the pre-registered protocol (bench/protocol.yaml)")
    ap.add_argument("--seeds", default=None, help="a subset of the protocol's seeds (default: all, in order)")
    ap.add_argument("--methods", default=None, help="a subset of the protocol's methods (default: all)")
    ap.add_argument("--store", default=None, help="storage.uri, a local directory (default: the config's)")
    ap.add_argument("--records", default=str(DEFAULT_DIR), help="where the per-answer records go")
    ap.add_argument("--chunk", type=int, default=5, help="iterations per flow run (resumable between them)")
    ap.add_argument("--table-only", action="store_true", help="no training: the table from the records")
    ap.add_argument("--docs", default=None, help="with --table-only: write the table into this file's grid section")
    ap.add_argument("--readme", default=None,
                    help="with --table-only: write the short form into this file's grid summary (README.md)")
    ap.add_argument("--resamples", type=int, default=None,
                    help="with --table-only: bootstrap replicates (default: the protocol's; others are exploratory)")
    a = ap.parse_args()
    if is_addendum(a.protocol):
        return addendum_main(ap, a)
    try:
        protocol = load_protocol(a.protocol)
    except ProtocolError as e:
        ap.error(str(e))
    seeds = _list(ap, a.seeds, protocol.seeds, "seeds", int)
    methods = _list(ap, a.methods, list(protocol.methods), "methods")
    records = Path(a.records)
    if a.table_only:
        try:
            return table(protocol, records, a.docs, a.resamples, a.readme)
        except (RecordError, ValueError) as e:
            ap.error(str(e))
    if a.chunk < 1:
        ap.error("--chunk must be >= 1")
    t0 = time.perf_counter()
    store, files, split = store_and_split(ap, protocol, a.store, sorted(set(seeds) | set(protocol.seeds)), a.chunk)
    for seed in seeds:
        run_seed(protocol, files, split, store, seed, methods, a.chunk, records)
    print(f"grid: seeds {', '.join(map(str, seeds))} done in {(time.perf_counter() - t0) / 3600:.2f} h", flush=True)
    table(protocol, records, None, None)


if __name__ == "__main__":
    main()
