"""The methods grid of the pre-registered protocol (bench/grid.py, bench/grid_protocol.py, bench/grid_table.py):
the protocol file checked, the fixed split, the records and the table rebuilt from them. Pure: no Ray, vLLM
or Prefect, except the one smoke test of the whole grid on the tiny model (marked slow)."""

import collections
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from bench.grid_protocol import (
    ProtocolError,
    Split,
    SplitError,
    build_split,
    check_disjoint,
    load_protocol,
    write_split,
)
from bench.grid_records import DEFAULT_DIR, MAX_RECORD_BYTES, RecordError, read_records, record_name, write_record
from bench.grid_table import BEGIN, END, README_BEGIN, README_END, build_table, docs_section, replace_section
from rlcr.config import load_config
from rlcr.runs.task_sets import held_out_set, sft_tasks, training_pool
from rlcr.tasks.registry import get_task

ROOT = Path(__file__).resolve().parents[1]
PROTOCOL = ROOT / "bench" / "protocol.yaml"
COUNTDOWN = get_task("countdown")


@pytest.fixture(scope="module")
def protocol():
    return load_protocol(PROTOCOL)


@pytest.fixture(scope="module")
def split(protocol):
    return build_split(protocol, load_config(ROOT / protocol.config, protocol.overrides()))


# ----------------------------------------------------------------------------------------------- the protocol
def test_the_committed_protocol_reads_as_registered(protocol):
    assert protocol.seeds == [1, 2, 3] and protocol.iterations == 30 and protocol.split_seed == 7_000_003
    assert protocol.sizes == {"train": 600, "test": 256, "calibration": 128}
    assert protocol.equal_token == ["rlvr", "rlcr_single"]
    assert "method.lambda_conf=10.0" in protocol.methods["rlcr"]
    assert "rollout.num_generations_confidence=2" in protocol.methods["rlcr"]
    primary, paper = protocol.decodings
    assert (primary.answers_per_task, primary.temperature, primary.unparsed_as_zero) == (8, None, False)
    assert (paper.answers_per_task, paper.temperature, paper.unparsed_as_zero) == (1, 0.0, True)
    assert (protocol.n_resamples, protocol.level) == (2000, 0.95)
    cfg = load_config(ROOT / protocol.config, protocol.overrides("rlcr"))  # every override is a real field
    assert (cfg.rollout.temperature, cfg.update.learning_rate, cfg.method.scale_by_std, cfg.loss.clip_high,
            cfg.method.lambda_conf, cfg.sft.tasks, cfg.run.iterations) == (0.8, 5e-6, False, 0.28, 10.0, 120, 30)


def test_the_decision_applies_the_registered_accuracy_margin():
    """The non-inferiority margin that decides the goal is the one bench/protocol.yaml registered in words."""
    import yaml

    from rlcr.evaluation.protocol_stats import NON_INFERIORITY_MARGIN, decide

    rule = yaml.safe_load(PROTOCOL.read_text())["goals"]["accuracy_non_inferior"]
    assert f"> -{NON_INFERIORITY_MARGIN:g} ({NON_INFERIORITY_MARGIN * 100:g} points)" in rule
    for lower, met in ((-NON_INFERIORITY_MARGIN + 1e-3, True), (-NON_INFERIORITY_MARGIN - 1e-3, False)):
        result = {"point": {"accuracy_vs_rlvr": 0.0}, "ci": {"accuracy_vs_rlvr": [lower, 0.01]}}
        assert decide(result)["accuracy_non_inferior"]["met"] is met


@pytest.mark.parametrize("edit, message", [
    (("learning_rate: 5.0e-6", "learning_rat: 5.0e-6"), r"shared\.learning_rat: unknown field"),
    (("split_seed: 7_000_003", "split_seed: seven"), r"tasks\.split_seed: must be an integer"),
    (("  iterations: 30\n", ""), r"shared\.iterations: missing"),
    (("answers_per_task: 8", "answers_per_task: 8.5"), r"evaluation\.primary\.answers_per_task: must be an integer"),
    (("decoding: greedy", "decoding: beam search"), r"evaluation\.paper_protocol\.decoding: must start with 'greedy'"),
    (("seeds: [1, 2, 3]", "seeds: [1, 1, 3]"), r"seeds: repeats a seed"),
    (("checkpoint: iteration 30", "checkpoint: iteration 20"), r"evaluation\.checkpoint: must read 'iteration 30"),
    (("  rlvr:        {num_generations_answer: equal-token (from calibration), lambda_conf: 1}\n", ""),
     r"methods\.rlvr: missing"),
])
def test_a_mistyped_protocol_field_is_a_one_line_error_naming_it(tmp_path, edit, message):
    text = PROTOCOL.read_text()
    assert edit[0] in text
    bad = tmp_path / "protocol.yaml"
    bad.write_text(text.replace(edit[0], edit[1], 1))
    with pytest.raises(ProtocolError, match=message) as e:
        load_protocol(bad)
    assert "\n" not in str(e.value) and str(bad) in str(e.value)


ADDENDUM = ROOT / "bench" / "protocol-2.yaml"


def test_the_committed_addendum_reads_as_registered():
    """bench/protocol-2.yaml (issue 51): fresh seeds 4 and 5, RLVR at RLCR's answer group size on every seed,
    the math task's shipped set out of domain, five goals each with its seed-level rule."""
    import yaml

    from bench.grid_protocol import ADDENDUM_GOALS, load_addendum
    from rlcr.evaluation.protocol_stats import NON_INFERIORITY_MARGIN

    a = load_addendum(ADDENDUM)
    assert a.seeds == [1, 2, 3, 4, 5] and a.new_seeds == [4, 5] and a.base.seeds == [1, 2, 3]
    assert a.runs == {"warm_start": [4, 5], "rlcr": [4, 5], "rlvr": [4, 5], "rlvr_g4": [1, 2, 3, 4, 5]}
    assert a.methods["rlvr_g4"] == ["rollout.num_generations_answer=4", "method.lambda_conf=1.0"]
    cfg = load_config(ROOT / a.base.config, [*a.base.overrides(), *a.methods["rlvr_g4"]])
    assert (cfg.rollout.num_generations_answer, cfg.method.lambda_conf) == (4, 1.0)
    math_ood = a.out_of_domain["math"]
    assert math_ood["answers_per_task"] == 4 and math_ood["policies"] == ["warm_start", "rlcr", "rlvr", "rlvr_g4"]
    assert sorted(a.raw["goals"]) == sorted(ADDENDUM_GOALS) and "t-interval" in a.raw["seed_level_test"]
    rule = yaml.safe_load(ADDENDUM.read_text())["goals"]["accuracy_non_inferior"]
    assert f"> -{NON_INFERIORITY_MARGIN:g} ({NON_INFERIORITY_MARGIN * 100:g} points)" in rule


@pytest.mark.parametrize("edit, message", [
    (("  rlvr_g4: all\n", "  rlvr_g5: all\n"), r"runs\.rlvr_g5: unknown field"),
    (("  new: [4, 5]", "  new: [2, 5]"), r"seeds\.new: must be fresh seeds"),
    (("  previous: [1, 2, 3]", "  previous: [1, 2]"), r"seeds\.previous: must be the base protocol's seeds"),
    (("{num_generations_answer: 4, lambda_conf: 1}", "{num_generations_answer: 9, lambda_conf: 1}"),
     r"methods\.rlvr_g4\.num_generations_answer: must be rlcr's answer group size \(4\)"),
    (("answers_per_task: 4 ", "answers_per_task: four "), r"out_of_domain\.math\.answers_per_task: must be an integer"),
    (("rlcr/tasks/data/math_style.jsonl]", "rlcr/tasks/data/../../../etc/passwd]"),
     r"out_of_domain\.math\.files: .* is not a shipped data set"),
    (("  rlcr: new\n", "  rlcr: some\n"), r"runs\.rlcr: must be one of new, all"),
    (("  brier_skill: RLCR", "  brier_skil: RLCR"), r"goals\.brier_skil: unknown field"),
    (("decision: >-", "decisions: >-"), r"decisions: unknown field"),
    (("    task: qa\n", "    task: math\n"), r"out_of_domain\.question_answering\.task: must be one of qa"),
    (("  - date: 2026-11-28\n", "  - date: 28 Nov 2026\n"), r"amendments: amendment 1: must be a date"),
    (("    seen_before: >-", "    seen: >-"), r"amendments: amendment 1: must have exactly the fields"),
])
def test_a_mistyped_addendum_field_is_a_one_line_error_naming_it(tmp_path, edit, message):
    from bench.grid_protocol import load_addendum

    text = ADDENDUM.read_text()
    assert edit[0] in text
    bad = tmp_path / "protocol-2.yaml"
    bad.write_text(text.replace(edit[0], edit[1], 1))
    with pytest.raises(ProtocolError, match=message) as e:
        load_addendum(bad, base=PROTOCOL)
    assert "\n" not in str(e.value) and str(bad) in str(e.value)



def test_the_addendum_runner_trains_and_evaluates_what_the_addendum_names(tmp_path):
    """bench/grid_addendum.py: every policy the addendum evaluates is trained on every seed (the out-of-domain
    rule reads rlcr and rlvr on seeds 1-3 too), rlvr_g4 is rlvr's settings at G_a = 4 and λ = 1, and the math
    evaluation reads the shipped set with the policy's settings and the math task's prompt and verifier."""
    from bench.grid import is_addendum
    from bench.grid_addendum import method_overrides, ood_config, ood_tasks, trained_here
    from bench.grid_protocol import load_addendum

    a = load_addendum(ADDENDUM)
    assert is_addendum(str(ADDENDUM)) and not is_addendum(str(PROTOCOL))
    assert trained_here(a, 1) == trained_here(a, 4) == ["rlcr", "rlvr", "rlvr_g4"]
    files = {"train": tmp_path / "train.jsonl", "test": tmp_path / "test.jsonl"}
    for f in files.values():
        f.write_text("")
    sizes = {"rlcr": 4, "rlvr": 9, "rlcr_single": 5}
    cfgs = {m: load_config(ROOT / a.base.config, method_overrides(a, files, tmp_path, 4, 5, m, "/sft", sizes))
            for m in ("rlcr", "rlvr", "rlvr_g4")}
    g4, rlvr, rlcr = cfgs["rlvr_g4"], cfgs["rlvr"], cfgs["rlcr"]
    assert (g4.method.name, g4.rollout.num_generations_answer, g4.method.lambda_conf) == ("rlvr", 4, 1.0)
    assert (rlvr.method.name, rlvr.rollout.num_generations_answer) == ("rlvr", 9)
    assert (rlcr.method.name, rlcr.rollout.num_generations_answer, rlcr.method.lambda_conf) == ("rlcr", 4, 10.0)
    same = lambda c: (c.model.name, c.run.seed, c.update.learning_rate, c.rollout.temperature, c.tasks.train_file)  # noqa: E731
    assert same(g4) == same(rlvr) == same(rlcr) == ("/sft", 4, 5e-6, 0.8, str(files["train"]))
    bounds = {}
    for key, task in (("math", "math"), ("question_answering", "qa")):
        m = ood_config(g4, a.out_of_domain[key])
        assert (m.tasks.name, m.tasks.options, m.tasks.eval_file, m.tasks.train_file) == (task, {}, None, None)
        assert (m.model.name, m.method.name, m.rollout.temperature, m.eval.samples) == ("/sft", "rlvr", 0.8, 4)
        bounds[task] = m.rollout.max_prompt_tokens
    # amendment 2: the QA set's turn 2 needs a larger prompt bound, which the engine's context holds beside a
    # confidence; the math set keeps the policy's
    assert bounds == {"math": g4.rollout.max_prompt_tokens, "qa": 480} and g4.rollout.max_prompt_tokens == 384
    assert 480 + g4.rollout.max_confidence_tokens <= g4.engine.max_model_len
    problems = ood_tasks(a, "math")
    assert len(problems) == 400 and len({get_task("math").identity(p) for p in problems}) == 400
    qa = ood_tasks(a, "question_answering")
    assert len(qa) == 120 and len({get_task("qa").identity(p) for p in qa}) == 120
    assert collections.Counter(p.evidence for p in qa) == {"full": 40, "partial": 40, "none": 40}


def test_the_qa_set_is_the_generator_s_bytes_and_the_amendment_names_it(tmp_path):
    """Amendment 1 of bench/protocol-2.yaml: the question-answering set is rlcr/tasks/data/qa_heldout.jsonl, which
    `python -m rlcr.tasks.qa_data` writes byte for byte (pure Python: the same on any CPU), from a generator seed no
    run draws from; a changed row would change the file."""
    from bench.grid_protocol import load_addendum
    from rlcr.tasks import qa_data

    shipped = ROOT / "rlcr" / "tasks" / "data" / qa_data.HELD_OUT_FILE
    assert qa_data.write_held_out(tmp_path).read_bytes() == shipped.read_bytes()
    a = load_addendum(ADDENDUM)
    qa = a.out_of_domain["question_answering"]
    assert (qa["task"], qa["files"], qa["answers_per_task"]) == ("qa", ["rlcr/tasks/data/qa_heldout.jsonl"], 4)
    assert [x["date"] for x in a.raw["amendments"]] == ["2026-11-28", "2026-11-29"]
    assert "out_of_domain_ece_qa" in a.raw["goals"]


def test_a_policy_is_trained_only_while_a_record_it_names_is_missing(tmp_path):
    """bench/grid_addendum.py's `missing`: on a new seed, every policy's in-domain (4), math and QA records; on a
    first-grid seed, rlvr_g4's in-domain ones and every policy's out-of-domain ones; a record on file is not
    missing."""
    from bench.grid_addendum import missing
    from bench.grid_protocol import load_addendum

    a = load_addendum(ADDENDUM)
    assert len(missing(a, 5, "rlcr", tmp_path)) == 6 and len(missing(a, 5, "warm_start", tmp_path)) == 6
    assert sorted(missing(a, 1, "rlcr", tmp_path)) == ["s1-rlcr-math-primary.parquet", "s1-rlcr-qa-primary.parquet"]
    assert len(missing(a, 1, "rlvr_g4", tmp_path)) == 6
    for name in missing(a, 2, "rlvr", tmp_path):
        (tmp_path / name).write_bytes(b"")
    assert missing(a, 2, "rlvr", tmp_path) == []
    assert missing(a, 2, "rlcr", tmp_path) == ["s2-rlcr-math-primary.parquet", "s2-rlcr-qa-primary.parquet"]

# ----------------------------------------------------------------------------------------------- the split
def _ids(tasks):
    return {COUNTDOWN.identity(t) for t in tasks}


def test_the_split_is_fixed_stratified_and_disjoint(protocol, split):
    cfg = load_config(ROOT / protocol.config, protocol.overrides())
    again = build_split(protocol, cfg.model_copy(update={"run.seed": 3}))  # the training seed does not enter
    assert {k: _ids(v) for k, v in again.parts().items()} == {k: _ids(v) for k, v in split.parts().items()}
    assert [len(split.train), len(split.test), len(split.calibration)] == [600, 256, 128]
    assert collections.Counter(len(t.nums) for t in split.test) == {2: 128, 3: 128}
    assert collections.Counter(len(t.nums) for t in split.calibration) == {2: 64, 3: 64}
    assert not _ids(split.test) & _ids(split.calibration)
    assert not (_ids(split.test) | _ids(split.calibration)) & _ids(split.train)
    check_disjoint(split, {}, COUNTDOWN)


def test_each_seed_reads_the_written_split_and_warm_starts_from_the_pool(protocol, split, tmp_path):
    files = write_split(split, tmp_path, COUNTDOWN)
    assert write_split(split, tmp_path, COUNTDOWN) == files  # a second write finds the same split: kept
    warm = {}
    for seed in protocol.seeds:
        cfg = load_config(ROOT / protocol.config, [*protocol.overrides(), f"run.seed={seed}",
                                                  f"tasks.train_file={files['train']}",
                                                  f"tasks.eval_file={files['test']}"])
        pool = training_pool(cfg)
        assert _ids(pool) == _ids(split.train) and _ids(held_out_set(cfg, pool)) == _ids(split.test)
        warm[seed] = sft_tasks(cfg, cfg.sft.tasks, pool)
    assert len({frozenset(_ids(v)) for v in warm.values()}) == 3  # one warm-start per seed, each its own tasks
    check_disjoint(split, warm, COUNTDOWN)


def test_a_violation_of_disjointness_is_refused(split):
    leaky = Split(split.train, split.test, [*split.calibration[:-1], split.test[0]])
    with pytest.raises(SplitError, match="test and calibration splits share 1 task"):
        check_disjoint(leaky, {}, COUNTDOWN)
    with pytest.raises(SplitError, match="test and train splits share"):
        check_disjoint(Split([*split.train, split.test[5]], split.test, split.calibration), {}, COUNTDOWN)
    with pytest.raises(SplitError, match="seed 2: 1 warm-start task"):
        check_disjoint(split, {1: split.train[:3], 2: [*split.train[:3], split.calibration[0]]}, COUNTDOWN)


def test_a_store_with_another_split_is_refused(split, tmp_path):
    write_split(split, tmp_path, COUNTDOWN)
    other = Split(split.train, split.test[::-1], split.calibration)
    with pytest.raises(SplitError, match="holds another test split"):
        write_split(other, tmp_path, COUNTDOWN)


# ----------------------------------------------------------------------------------------------- the table
WARM = {1: "a" * 64, 2: "b" * 64, 3: "c" * 64}


def _record(seed, policy, split, protocol, correct, confidence, strata, warm_start=None):
    n = len(correct)
    return pa.table({"seed": pa.array([seed] * n, pa.int32()), "method": [policy] * n, "split": [split] * n,
                     "protocol": [protocol] * n, "task": [f"{split}-t{i // 2}" for i in range(n)],
                     "stratum": [str(s) for s in strata], "prompt_id": pa.array([i // 2 for i in range(n)], pa.int32()),
                     "answer_id": pa.array([i % 2 for i in range(n)], pa.int32()),
                     "correct": pa.array(correct, pa.int8()),
                     "confidence": pa.array([None if c is None else float(c) for c in confidence], pa.float64()),
                     "warm_start": [warm_start or WARM.get(seed, "d" * 64)] * n})


def synthetic_records(directory, seeds=(1, 2, 3), rlcr_accuracy_drop=False):
    """Records where the answer is known: rlcr states confidence = correctness (Brier 0, ECE 0, AUROC 1),
    rlvr always 0.5 (its AUROC 0.5, ECE |0.5 − accuracy|); accuracy 0.75 on stratum 2 and 0.25 on stratum 3,
    2 answers per task. With ``rlcr_accuracy_drop`` rlcr answers right only half as often."""
    rng = np.random.default_rng(0)
    for seed in seeds:
        for split, n_tasks in (("test", 40), ("calibration", 20)):
            strata = np.repeat([2, 3], n_tasks)  # n_tasks tasks per stratum, 2 answers each
            p = np.where(strata == 2, 0.75, 0.25)
            base = (rng.random(strata.size) < p).astype(int)
            base[:2], base[2:4] = [1, 0], [0, 1]  # both classes in each stratum
            base[-2:] = [1, 0]
            for policy in ("warm_start", "rlcr", "rlvr", "rlcr_single"):
                correct = base.copy()
                if policy == "rlcr" and rlcr_accuracy_drop:
                    correct = base * (np.arange(base.size) % 2)
                conf = {"rlcr": correct, "rlvr": np.full(base.size, 0.5)}.get(policy, np.clip(p + 0.1, 0, 1))
                for protocol in ("primary", "paper"):
                    c = [None if (policy == "rlcr_single" and i == 0) else v for i, v in enumerate(conf)]
                    write_record(Path(directory), record_name(seed, policy, split, protocol),
                                 _record(seed, policy, split, protocol, correct.tolist(), c, strata.tolist()))



def addendum_records(first, second, seeds=(1, 2, 3, 4, 5), g4_seeds=(1, 2, 3, 4, 5), math_seeds=(1, 2, 3, 4, 5),
                     qa_seeds=(1, 2, 3, 4, 5)):
    """The addendum's records where the answer is known (as :func:`synthetic_records`): rlcr states its
    correctness, rlvr and rlvr_g4 0.5, the same answers right for all; seeds 1–3 of warm_start/rlcr/rlvr in
    ``first`` (the first grid's), the rest in ``second``; on the math set rlcr again states its correctness and
    the others 0.9 (over-confident); on the QA set the other way round: rlvr states its correctness, rlcr 0.9."""
    rng = np.random.default_rng(1)
    ood = {"math": math_seeds, "qa": qa_seeds}
    for seed in seeds:
        for split, n_tasks in (("test", 30), ("calibration", 15), ("math", 20), ("qa", 12)):
            strata = np.repeat([2, 3], n_tasks)
            p = np.where(strata == 2, 0.75, 0.25)
            base = (rng.random(strata.size) < p).astype(int)
            base[:4], base[-2:] = [1, 0, 0, 1], [1, 0]
            for policy in ("warm_start", "rlcr", "rlvr", "rlvr_g4"):
                if (policy == "rlvr_g4" and seed not in g4_seeds) or seed not in ood.get(split, seeds):
                    continue
                knows = "rlvr" if split == "qa" else "rlcr"
                conf = base if policy == knows else np.full(base.size, 0.9 if split in ood else 0.5)
                where = first if seed <= 3 and policy != "rlvr_g4" and split not in ood else second
                write_record(Path(where), record_name(seed, policy, split, "primary"),
                             _record(seed, policy, split, "primary", base.tolist(), conf.tolist(), strata.tolist()))


def test_the_addendum_table_decides_its_six_goals_on_both_intervals(tmp_path):
    """bench/grid_addendum_table.py from records alone: the first grid's and the addendum's merged, each goal's
    figure on the bootstrap and the seed-level t-interval over seeds 1-5, met only when both hold; undecided
    while a seed lacks a goal's records; an evaluation on record twice is refused."""
    from bench.grid_addendum_table import build_addendum_table
    from bench.grid_protocol import load_addendum

    addendum = load_addendum(ADDENDUM)
    first, second = tmp_path / "grid", tmp_path / "grid-2"
    addendum_records(first, second)
    docs, headline = build_addendum_table(addendum, first, second, n_resamples=100)
    assert headline == "5/6"
    goals = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in docs.splitlines()
             if line.startswith("| ") and line.split(" | ")[0].strip("| ") in
             ("within_stratum_auroc", "recalibrated_brier", "brier_skill", "accuracy_non_inferior", "out_of_domain_ece",
              "out_of_domain_ece_qa")}
    qa = goals.pop("out_of_domain_ece_qa")  # the QA set's records, not the math set's: rlvr knows there
    assert qa[4] == "no / no" and qa[5] == "**not met**" and qa[1].startswith("QA set: RLCR − RLVR, ECE")
    assert len(goals) == 5 and all(g[4] == "yes / yes" and g[5] == "**met**" for g in goals.values())
    assert goals["within_stratum_auroc"][1].split(": ")[1].startswith("0.500 [0.500, 0.500]")  # 1 − 0.5
    assert goals["brier_skill"][1].split(": ")[1].startswith("1.000")
    assert goals["accuracy_non_inferior"][1].split(": ")[1].startswith("0.000 [0.000, 0.000]")
    assert goals["accuracy_non_inferior"][2].startswith("0.000 [0.000, 0.000]")  # seed level
    assert "s1 " in goals["out_of_domain_ece"][1] and "s5 " in goals["out_of_domain_ece"][1]
    assert "rlvr + Platt per stratum" in docs and docs.count("**Out of domain**") == 2 and "qa_heldout.jsonl" in docs
    assert ("seed 5: in domain warm_start, rlcr, rlvr, rlvr_g4; math warm_start, rlcr, rlvr, rlvr_g4; "
            "qa warm_start") in docs

    partial = tmp_path / "partial"
    addendum_records(partial / "grid", partial / "grid-2", g4_seeds=(1, 2, 3, 4))
    docs, headline = build_addendum_table(addendum, partial / "grid", partial / "grid-2", n_resamples=50)
    assert headline == "undecided (5/6 goals decided)"  # rlvr_g4 lacks seed 5: accuracy waits
    line = next(x for x in docs.splitlines() if x.startswith("| accuracy_non_inferior"))
    assert "not decided" in line and "s4 " in line and "s5 " not in line.split(" | ")[1]
    addendum_records(partial / "qa" / "grid", partial / "qa" / "grid-2", qa_seeds=(4, 5))
    docs, headline = build_addendum_table(addendum, partial / "qa" / "grid", partial / "qa" / "grid-2", n_resamples=50)
    assert headline == "undecided (5/6 goals decided)"  # the QA set on seeds 4 and 5 only: its goal waits
    line = next(x for x in docs.splitlines() if x.startswith("| out_of_domain_ece_qa"))
    assert "not decided" in line and "s4 " in line and "s1 " not in line.split(" | ")[1]
    write_record(second, record_name(1, "rlcr", "test", "primary"),
                 _record(1, "rlcr", "test", "primary", [1, 0], [1.0, 0.0], [2, 3]))
    with pytest.raises(RecordError, match="s1-rlcr-test-primary is also on record"):
        build_addendum_table(addendum, first, second, n_resamples=10)

def test_the_addendum_names_which_records_came_from_a_recomputed_warm_start(tmp_path):
    """A seed's policies retrained in a later session on another CPU start from a warm-start with other bits:
    the addendum's table names, per seed, each warm-start with the policies (rlvr_g4 included) and, for a
    policy on both, the records (split and protocol) that came from each."""
    import pyarrow.parquet as pq

    from bench.grid_addendum_table import build_addendum_table
    from bench.grid_protocol import load_addendum

    first, second = tmp_path / "grid", tmp_path / "grid-2"
    addendum_records(first, second, seeds=(4, 5), g4_seeds=(4, 5), math_seeds=(4, 5), qa_seeds=(4, 5))
    for policy in ("rlcr", "rlvr", "rlvr_g4"):  # seed 4's QA records retrained from a recomputed warm-start
        path = second / record_name(4, policy, "qa", "primary")
        t = pq.read_table(path)
        path.unlink()
        write_record(second, path.name, t.set_column(t.schema.get_field_index("warm_start"), "warm_start",
                                                     pa.array(["f" * 64] * t.num_rows)))
    docs, _ = build_addendum_table(load_addendum(ADDENDUM), first, second, n_resamples=20)
    assert re.search(r"seed 5: one warm-start \(\w{12}\) for warm_start, rlcr, rlvr, rlvr_g4\.", docs)
    assert ("seed 4: **2 different warm-starts** (recomputed in sessions on other CPUs): "
            f"{WARM.get(4, 'd' * 64)[:12]} for warm_start, rlcr (calibration primary, math primary, test primary), "
            "rlvr (calibration primary, math primary, test primary), rlvr_g4 (calibration primary, math primary, "
            "test primary); ffffffffffff for rlcr (qa primary), rlvr (qa primary), rlvr_g4 (qa primary)") in docs


def test_the_table_rebuilds_from_records_and_decides_the_goals(tmp_path, protocol):
    synthetic_records(tmp_path)
    table, summary, headline = build_table(tmp_path, protocol, n_resamples=200)
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines() if line.startswith("| ")}
    rlcr = rows["rlcr"].split(" | ")
    assert rlcr[1] == "1, 2, 3"
    assert rlcr[3].startswith("0.000 [0.000, 0.000]") and rlcr[5].startswith("0.000 [0.000, 0.000]")  # ECE, Brier
    assert rlcr[7].startswith("1.000 [1.000, 1.000]")  # within-stratum AUROC
    assert rows["rlvr"].split(" | ")[7].startswith("0.500")
    assert rows["difficulty prior of rlvr"].split(" | ")[6].startswith("0.000")  # the prior's skill over itself
    # constant within each stratum of a seed: 0.5 per seed (pooled over seeds the priors differ by seed)
    assert rows["difficulty prior of rlcr"].split(" | ")[7].endswith("(s1 0.500, s2 0.500, s3 0.500; mean 0.500)")
    goals = [line for line in table.splitlines() if "**met**" in line or "**not met**" in line]
    assert len(goals) == 4 and all("**met**" in g for g in goals)
    assert headline == "4/4"
    # the README's short form: no table (docs/results.md holds them), no per-seed values, the four verdicts
    assert not [line for line in summary.splitlines() if line.startswith("|")] and "(s1" not in summary
    verdicts = [line for line in summary.splitlines() if line.startswith("- ")]
    assert len(verdicts) == 4 and all(": **met**, " in v for v in verdicts)
    assert "RLCR's ECE is below RLVR's (rule: upper bound < 0): **met**, -" in summary  # the goal's own figure


def test_the_table_reads_each_goal_at_the_seed_level_and_adds_the_round_2_baselines(tmp_path, protocol):
    """Issue 51: beside each goal's bootstrap, the mean of its per-seed values and their t-interval (df = n − 1)
    with the rule applied to it; stratum-aware recalibration rows (Platt and isotonic per stratum, fitted on
    the calibration split) for RLVR and RLCR, with paired differences; the goals' figures under greedy decoding
    and the number of distinct confidences per seed; the temperature sub-goal called vacuous."""
    from scipy import stats

    synthetic_records(tmp_path)
    table, summary, headline = build_table(tmp_path, protocol, n_resamples=100)
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines() if line.startswith("| ")}
    # rlvr states 0.5 everywhere: a Platt map per stratum turns that into the stratum's calibration rate, which
    # is the difficulty prior (skill 0, within-stratum AUROC 0.5); rlcr's 0/1 confidences stay perfect
    platt = rows["rlvr + Platt per stratum †"].split(" | ")
    assert platt[6].startswith("0.000") and platt[7].endswith("(s1 0.500, s2 0.500, s3 0.500; mean 0.500)")
    assert rows["rlcr + isotonic per stratum †"].split(" | ")[5].startswith("0.000 [0.000, 0.000]")  # Brier
    assert "rlcr + Platt per stratum †" in rows and "rlvr + isotonic per stratum †" in rows
    # per-seed means beside the pooled point
    assert re.search(r"\(s1 [-\d.]+, s2 [-\d.]+, s3 [-\d.]+; mean [-\d.]+\)", rows["rlvr"])
    # the seed level of each goal: the t-interval of its per-seed values, recomputed here with scipy
    goal = next(line for line in table.splitlines() if line.startswith("| ece |"))  # differs by seed
    per = [float(x) for x in re.search(r"\(s1 ([-\d.]+), s2 ([-\d.]+), s3 ([-\d.]+);", goal).groups()]
    lo, hi = stats.t.interval(0.95, 2, loc=np.mean(per), scale=stats.sem(per))
    mean, t_lo, t_hi = map(float, re.search(r"\| ([-\d.]+) \[([-\d.]+), ([-\d.]+)\] \| \*\*does not hold\*\* \|$",
                                             goal).groups())
    assert (mean, t_lo, t_hi) == pytest.approx((np.mean(per), lo, hi), abs=2e-3) and t_hi > 0  # per-seed rounding
    assert "**met**" in goal and "Met by the registered rule but not at the seed level: ece." in table
    assert "df 2]" in table and "vacuous: temperature scaling is monotone" in table
    assert ("| RLCR − (RLVR + Platt per stratum) | " in table
            and "seed level" in rows["RLCR − (RLVR + Platt per stratum)"])
    assert "rlcr s1 2, s2 2, s3 2; rlvr s1 1, s2 1, s3 1" in table  # distinct greedy confidences per seed
    assert "**† The goals' figures under the paper protocol**" in table
    # the README's short form: each goal with its seed-level reading, the exploratory lines
    verdicts = [line for line in summary.splitlines() if line.startswith("- ")]
    assert all("† seed level (mean of seeds [95% t-interval, df 2]) " in v for v in verdicts)
    assert "a Platt map per stratum fitted on the calibration split" in summary
    assert "greedy RLCR states 2, 2, 2 distinct confidences on seeds 1, 2, 3" in summary
    assert headline == "4/4"  # the registered verdicts are unchanged by the added readings


def test_goals_fail_by_their_rules_and_wait_for_every_seed(tmp_path, protocol):
    synthetic_records(tmp_path / "drop", rlcr_accuracy_drop=True)
    table, summary, headline = build_table(tmp_path / "drop", protocol, n_resamples=200)
    accuracy = next(line for line in table.splitlines() if line.startswith("| accuracy_non_inferior"))
    assert "**not met**" in accuracy and headline == "3/4"
    assert "> −0.03): **not met**, " in summary
    synthetic_records(tmp_path / "one", seeds=(1,))
    table, summary, headline = build_table(tmp_path / "one", protocol, n_resamples=200)
    assert headline == "undecided (1/3 seeds)" and "**met**" not in table and "not decided" in table
    assert "**met**" not in summary and summary.count(": not decided, ") == 4
    assert "seed 1: warm_start, rlcr, rlvr, rlcr_single" in table and "seed 2: no complete policy" in table


def test_each_seeds_warm_start_is_named_and_a_recomputed_one_is_flagged(tmp_path, protocol):
    """A seed spread over sessions trains its warm-start again; the records name its weights' sha256, and the
    table says whether a seed's policies share one."""
    from bench.grid_records import weights_digest

    synthetic_records(tmp_path, seeds=(1, 2))
    table = build_table(tmp_path, protocol, n_resamples=50).docs
    assert "seed 1: one warm-start (aaaaaaaaaaaa) for warm_start, rlcr, rlvr, rlcr_single" in table
    (tmp_path / "s2-rlvr-test-paper.parquet").unlink()
    write_record(tmp_path, record_name(2, "rlvr", "test", "paper"),
                 _record(2, "rlvr", "test", "paper", [1, 0], [0.5, 0.5], [2, 3], warm_start="e" * 64))
    table = build_table(tmp_path, protocol, n_resamples=50).docs
    assert "seed 2: **2 different warm-starts** (recomputed in sessions on other CPUs): bbbbbbbbbbbb for " \
           "warm_start, rlcr, rlvr (calibration paper, calibration primary, test primary), rlcr_single; " \
           "eeeeeeeeeeee for rlvr (test paper)" in table
    bad = tmp_path / "bad"
    write_record(bad, record_name(1, "rlcr", "test", "primary"),
                 _record(1, "rlcr", "test", "primary", [1], [0.5], [2], warm_start="../../etc"))
    with pytest.raises(RecordError, match="column warm_start must hold one sha256"):
        read_records(bad)
    a, b = tmp_path / "ckpt-a", tmp_path / "ckpt-b"
    for d, byte in ((a, b"\x00"), (b, b"\x01")):
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"w" * 100 + byte)
        (d / "config.json").write_text(str(d))  # not part of the weights
    assert weights_digest(a) != weights_digest(b) and len(weights_digest(a)) == 64
    (b / "model.safetensors").write_bytes(b"w" * 100 + b"\x00")
    assert weights_digest(a) == weights_digest(b)


def test_records_are_create_only_and_checked(tmp_path):
    synthetic_records(tmp_path, seeds=(1,))
    with pytest.raises(FileExistsError):
        write_record(tmp_path, record_name(1, "rlcr", "test", "primary"), _record(1, "rlcr", "test", "primary",
                                                                                 [1], [0.5], [2]))
    assert len(read_records(tmp_path)) == 16
    (tmp_path / "s2-rlcr-test-primary.parquet").write_bytes(
        (tmp_path / "s1-rlcr-test-primary.parquet").read_bytes())
    with pytest.raises(RecordError, match="s2-rlcr-test-primary.parquet: column seed holds 1"):
        read_records(tmp_path)
    (tmp_path / "s2-rlcr-test-primary.parquet").unlink()
    big = tmp_path / "s3-rlcr-test-primary.parquet"  # bounded before Parquet reads a byte of it
    with open(big, "wb") as f:
        f.truncate(MAX_RECORD_BYTES + 1)
    with pytest.raises(RecordError, match="s3-rlcr-test-primary.parquet: not a regular file of at most"):
        read_records(tmp_path)
    big.unlink()
    (tmp_path / "s3-rlcr-test-primary.parquet").symlink_to(tmp_path / "s1-rlcr-test-primary.parquet")
    with pytest.raises(RecordError, match="not a regular file"):
        read_records(tmp_path)


@pytest.mark.parametrize("text, message", [
    ('{"num_generations_answer": {"rlcr": 4}}', "not a group-size plan"),
    ('{"num_generations_answer": {"rlcr": 4, "rlvr": true}, "mean_lengths": {}}', "not a group-size plan"),
    ('{"num_generations_answer": {"rlcr": 4, "rlvr": 9}, "mean_lengths": {"rlcr": "x"}}', "not a group-size plan"),
    ("[" * 100_000, "nested deeper than"),
])
def test_a_stored_group_size_plan_is_checked_before_it_is_used(tmp_path, text, message):
    """The kept group sizes (`<store>/grid-s<seed>-plan.json`, bench/methods.py's `<prefix>-plan.json`) are read
    bounded and checked: a group size >= 1 for every method of the run, numeric lengths; else one line naming
    the file (nothing is recalibrated over it)."""
    from bench.methods import group_size_plan
    from rlcr.untrusted import InvalidInput

    path = tmp_path / "grid-s1-plan.json"
    path.write_text(text)
    with pytest.raises(InvalidInput, match=message) as e:
        group_size_plan(None, path, "unused", ["rlcr", "rlvr"])
    assert "grid-s1-plan.json" in str(e.value) and "\n" not in str(e.value)
    path.write_text('{"num_generations_answer": {"rlcr": 4, "rlvr": 9}, "mean_lengths": {"rlcr": 80.5}}')
    assert group_size_plan(None, path, "unused", ["rlcr", "rlvr"])["num_generations_answer"]["rlvr"] == 9


def test_docs_section_is_replaced_between_its_markers():
    text = f"# Results\n\nintro\n{BEGIN}\nold\n{END}\nafter\n"
    new = replace_section(text, "| new |")
    assert docs_section(new) == "| new |" and new.endswith(f"{END}\nafter\n") and "old" not in new
    readme = f"# rlcr\n{README_BEGIN}\nold\n{README_END}\n{BEGIN}\nkept\n{END}\n"
    new = replace_section(readme, "short", README_BEGIN, README_END)
    assert docs_section(new, README_BEGIN, README_END) == "short" and docs_section(new) == "kept"
    with pytest.raises(ValueError, match="one grid-summary begin marker"):
        replace_section(text, "short", README_BEGIN, README_END)


def test_the_docs_table_is_rebuilt_from_the_committed_records(protocol):
    """Once bench/results/grid/ holds records, docs/results.md's pre-registered section and the README's
    "Methods compared" summary are exactly what the builder makes of them."""
    if not any(DEFAULT_DIR.glob("*.parquet")):
        pytest.skip("bench/results/grid/ holds no records yet: the grid has not been run (bench/grid.py)")
    built = build_table(DEFAULT_DIR, protocol)
    assert docs_section((ROOT / "docs" / "results.md").read_text()) == built.docs
    assert docs_section((ROOT / "README.md").read_text(), README_BEGIN, README_END) == built.summary


def test_the_docs_addendum_section_is_rebuilt_from_the_committed_records():
    """docs/results.md's addendum section is exactly what bench/grid_addendum_table.py makes of the committed
    records of both grids (the first grid's alone until the addendum's runs add theirs)."""
    from bench.grid_addendum_table import BEGIN as A_BEGIN, END as A_END, build_addendum_table
    from bench.grid_protocol import load_addendum

    built = build_addendum_table(load_addendum(ADDENDUM))
    assert docs_section((ROOT / "docs" / "results.md").read_text(), A_BEGIN, A_END) == built.docs


# ----------------------------------------------------------------------------------------------- greedy decoding
@pytest.mark.parametrize("temperature, expected", [(None, 0.8), (0.0, 0.0)])
def test_an_evaluation_temperature_reaches_both_stages_and_the_engine(monkeypatch, temperature, expected):
    """The paper protocol decodes greedily: ``evaluate_policy(temperature=0)`` → the stages → the engine's
    sampling call (vLLM reads temperature < 1e-5 as greedy); None keeps ``rollout.temperature``."""
    import rlcr.rollout.sampling as sampling
    from rlcr.rollout.pipeline import _stage_steps
    from rlcr.rollout.stages import AnswerStage, _EngineStage

    cfg = load_config(ROOT / "configs" / "methods.yaml")
    answer, confidence = _stage_steps(cfg, "file:///policy", 7, None, 2, 1, temperature)
    assert (answer["fn_constructor_kwargs"]["temperature"] == confidence["fn_constructor_kwargs"]["temperature"]
            == temperature)
    seen = {}
    monkeypatch.setattr(sampling, "sample_chats", lambda *a, **kw: seen.update(kw) or ([], []))
    stage = object.__new__(AnswerStage)
    stage.cfg, stage.engine, stage.llm, stage.tokenizer, stage.seed = cfg, None, object(), None, 7
    stage.temperature = cfg.rollout.temperature if temperature is None else temperature  # as __init__ resolves it
    stage._generate([], [], 8, None, 1, [])
    assert seen.pop("temperature") == expected
    # both turns in one engine run (rollout.pipeline_turns): the same temperature for both
    monkeypatch.setattr(sampling, "sample_tree", lambda *a, **kw: seen.update(kw) or ([], [], []))
    stage._generate_tree([], [], [], [], 2, 1)
    assert seen["temperature"] == expected
    assert "temperature" in _EngineStage.__init__.__code__.co_varnames
    from rlcr.rollout.pipeline import build_rollout_dataset

    with pytest.raises(ValueError, match=r"temperature must be in \[0, 2\]"):
        build_rollout_dataset(cfg, [], "file:///policy", 1, temperature=-1.0)


# ----------------------------------------------------------------------------------------------- smoke
@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("RLCR_GRID_SMOKE"), reason="the grid end to end (~3 min alone) would take "
                    "`make test` to the edge of its 30-minute budget: `make test-grid` runs it (RLCR_GRID_SMOKE=1)")
def test_the_grid_runs_end_to_end_on_the_tiny_model(tmp_path):
    """bench/grid.py on a tiny protocol (tests/data/grid_tiny_protocol.yaml: the tiny random model, 12 training
    tasks, 4 test and 4 calibration tasks, one seed, one iteration; rlcr and rlvr): split, warm-start, group
    sizes, runs, the 12 evaluations as records, and the table from them. 163 s alone on the 2 cores (6.5 min shared)."""
    protocol = ROOT / "tests" / "data" / "grid_tiny_protocol.yaml"
    records = tmp_path / "records"
    cmd = [sys.executable, str(ROOT / "bench" / "grid.py"), "--protocol", str(protocol), "--store",
           str(tmp_path / "store"), "--records", str(records), "--chunk", "1", "--methods", "rlcr,rlvr"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    names = sorted(p.name for p in records.glob("*.parquet"))
    assert names == sorted(record_name(1, p, s, d) for p in ("warm_start", "rlcr", "rlvr")
                           for s in ("test", "calibration") for d in ("primary", "paper"))
    answers = read_records(records)
    assert len(answers[(1, "rlcr", "test", "primary")].task) == 4 * 2  # 4 tasks × 2 answers
    assert len(answers[(1, "rlvr", "test", "paper")].task) == 4  # greedy: 1 answer per task
    assert done.stdout.strip().splitlines()[-1].startswith("grid goals met: ")
    assert (tmp_path / "store" / "grid-split" / "test.jsonl").read_text().count("\n") == 4
