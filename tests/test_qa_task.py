"""The ``qa`` task (issue 47 item 5): short-answer questions over generated fictional entities with supporting
paragraphs missing at random. The generator is deterministic; answers follow from the full context and not
from a context missing evidence; SQuAD-style exact match and token F1; scoring, records, the one-turn form and
the warm-start through the task interface; and (slow) one training iteration through the real flow."""

import hashlib
import json
import re
from collections import Counter
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest

from rlcr.tasks.base import FORMAT_ONLY_CONFIDENCES, TaskFormatError
from rlcr.tasks.qa import MAX_ANSWER_CHARS, Options, QATask, answer_f1
from rlcr.tasks.qa_data import EVIDENCE_STATES, exact_match, normalize_answer, token_f1
from rlcr.tasks.registry import get_task

GOLDEN = "9b2a6110cca18208"  # sha256[:16] of generate(24, seed=7)'s records: a change of the generator changes it


def digest(problems) -> str:
    task = get_task("qa")
    text = json.dumps([task.to_record(p) for p in problems], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# ---- a reference reader of the generated paragraphs and questions (regexes over the four sentence forms)

NAME = r"([A-Z][a-z]+(?: [A-Z][a-z]+)?)"
FACTS = [
    ("born", re.compile(rf"^{NAME} is an? \w+ who was born in {NAME}\.$"), (1, 2)),
    ("works", re.compile(rf"^{NAME} is an? \w+ who works for {NAME}\.$"), (1, 2)),
    ("based", re.compile(rf"^{NAME} is home to {NAME}, an? \w+ company\.$"), (2, 1)),
    ("founded", re.compile(rf"^{NAME} is an? \w+ company founded by {NAME}\.$"), (1, 2)),
]
QUESTIONS = [
    (("works", "based"), re.compile(rf"^In which town is the company that {NAME} works for based\?$")),
    (("works", "founded"), re.compile(rf"^Who founded the company that {NAME} works for\?$")),
    (("founded", "born"), re.compile(rf"^In which town was the founder of {NAME} born\?$")),
    (("born",), re.compile(rf"^In which town was {NAME} born\?$")),
    (("works",), re.compile(rf"^Which company does {NAME} work for\?$")),
    (("based",), re.compile(rf"^In which town is {NAME} based\?$")),
    (("founded",), re.compile(rf"^Who founded {NAME}\?$")),
]


def facts_of(paragraphs) -> dict:
    """{(relation, subject): object} of the paragraphs; a subject given two objects for one relation fails."""
    facts = {}
    for p in paragraphs:
        (rel, m, (s, o)), = [(rel, m, idx) for rel, rx, idx in FACTS if (m := rx.match(p))]
        assert facts.setdefault((rel, m.group(s)), m.group(o)) == m.group(o), p
    return facts


def resolve(question: str, paragraphs) -> str | None:
    """The answer the paragraphs give to the question, or None when a fact of its chain is missing."""
    (chain, subject), = [(chain, m.group(1)) for chain, rx in QUESTIONS if (m := rx.match(question))][:1]
    facts = facts_of(paragraphs)
    for rel in chain:
        subject = facts.get((rel, subject))
        if subject is None:
            return None
    return subject


# ---- the generator


def test_the_generator_is_deterministic_and_draws_the_evidence_states_in_equal_shares():
    task = get_task("qa")
    a, b = task.generate(24, 7), task.generate(24, 7)
    assert a == b and digest(a) == digest(b) == GOLDEN
    assert digest(task.generate(24, 8)) != GOLDEN
    assert [p.evidence for p in a] == list(EVIDENCE_STATES) * 8 and task.strata() == list(EVIDENCE_STATES)
    assert all(p.hops == 2 for p in a if p.evidence == "partial") and {p.hops for p in a} == {1, 2}
    assert all(len(p.paragraphs) == 4 and len(p.support) == p.hops for p in a)
    assert len({task.identity(p) for p in task.generate(300, 1)}) == 300  # a large name space: no repeats


def test_answers_follow_from_the_full_context_and_removed_evidence_is_gone():
    task = get_task("qa")
    problems = task.generate(300, 3)
    for p in problems:
        kept = [s for s in p.support if s in p.paragraphs]
        assert len(kept) == {"full": p.hops, "partial": 1, "none": 0}[p.evidence], p
        assert set(p.removed) == set(p.support) - set(kept)
        text = task.user_text(p)
        assert all(s not in text for s in p.removed) and p.question in text
        assert resolve(p.question, p.support) == p.answer  # the supporting paragraphs answer it
        if p.evidence == "full":
            assert resolve(p.question, p.paragraphs) == p.answer
        else:
            assert resolve(p.question, p.paragraphs) is None  # the chain breaks where evidence is missing
    # with evidence missing the gold is often still among the context's names: a guess can be right by chance
    missing = [p for p in problems if p.evidence == "none"]
    share = sum(p.answer in " ".join(p.paragraphs) for p in missing) / len(missing)
    assert 0.3 < share < 1.0


def test_options_shape_the_generation_and_refuse_unknown_settings():
    task = get_task("qa")
    cfg = SimpleNamespace(tasks=SimpleNamespace(options={"paragraphs": 6, "evidence": ["none", "full"],
                                                         "two_hop_share": 1.0}))
    problems = task.generate(10, 0, cfg)
    assert [p.evidence for p in problems] == ["none", "full"] * 5 and task.strata(cfg) == ["none", "full"]
    assert all(len(p.paragraphs) == 6 and p.hops == 2 for p in problems)
    assert task.generate(10, 0) != problems  # the defaults when the config has no options
    with pytest.raises(ValueError, match="paragraph"):
        Options(paragraph=3)
    with pytest.raises(ValueError):
        Options(evidence=("some",))


def test_without_the_gold_among_the_distractors_missing_evidence_leaves_it_out_of_the_context():
    """``gold_in_distractors: false``: a problem with its evidence missing never names the gold; with it the same
    stream names it in about half of them (the default, which the golden digest holds)."""
    task = get_task("qa")

    def named(options):
        cfg = SimpleNamespace(tasks=SimpleNamespace(options={"evidence": ["none"], **options}))
        problems = task.generate(200, 1, cfg)
        return sum(any(p.answer in q for q in p.paragraphs) for p in problems) / len(problems)
    assert named({"gold_in_distractors": False}) == 0.0
    assert 0.3 < named({}) < 0.8
    full = SimpleNamespace(tasks=SimpleNamespace(options={"evidence": ["full"], "gold_in_distractors": False}))
    assert all(any(p.answer in q for q in p.paragraphs) for p in task.generate(50, 1, full))


# ---- answer checks


def test_exact_match_normalises_like_squad_and_f1_counts_shared_tokens():
    assert normalize_answer("  The Vathor   Mills! ") == "vathor mills"
    assert exact_match("Vathor Mills", "the vathor mills.") and not exact_match("Vathor Mills", "Vathor")
    assert token_f1("Vathor Mills", "Vathor Group") == 0.5
    assert token_f1("Nidu Braiov", "Braiov") == pytest.approx(2 / 3)
    assert token_f1("Bruholm", "Kiport") == 0.0 and token_f1("Bruholm", "the") == 0.0


def test_scoring_through_the_interface():
    task = get_task("qa")
    p = next(p for p in task.generate(12, 5) if p.evidence == "full")
    right = f"<think>…</think>\n<answer>the {p.answer.lower()}.</answer>"
    wrong = "<think>…</think>\n<answer>Nobody Atall</answer>"
    assert task.score(right, p, format_score=0.1) == 1.0 and task.accuracy(right, p) == 1.0
    assert task.score(wrong, p, format_score=0.1) == 0.1 and task.accuracy(wrong, p) == 0.0
    assert task.score("no answer here", p, format_score=0.1) == 0.0 and task.score(None, p, format_score=0.1) == 0.0
    assert task.score(f"<answer>{'x' * (MAX_ANSWER_CHARS + 1)}</answer>", p, format_score=0.1) == 0.1
    assert answer_f1(right, p) == 1.0 and answer_f1(wrong, p) == 0.0 and answer_f1("", p) == 0.0
    half = f"<answer>{p.answer.split()[0]}</answer>"
    assert answer_f1(half, p) == (1.0 if len(p.answer.split()) == 1 else pytest.approx(2 / 3))
    from rlcr.rollout.records import answer_scores

    scores = answer_scores(right, p, format_score=0.1, task_name="qa")
    assert scores["correct"] == 1.0 and scores["score"] == 1.0


# ---- records, files, prompts, the warm-start


def test_records_round_trip_and_name_the_qa_task():
    from rlcr.rollout.records import record_task, rollout_row, rows_to_table, table_to_rows

    task = get_task("qa")
    problems = task.generate(6, 2)
    assert all(task.from_record(json.loads(json.dumps(task.to_record(p)))) == p for p in problems)
    rows = [rollout_row("answer", task=p, prompt_id=i, answer_id=0, context_text="c", context_ids=[1],
                        completion_text="<answer>x</answer>", completion_ids=[2], task_name="qa", score=0.0,
                        run_id="r", iteration=1, correct=0.0, reward=0.0) for i, p in enumerate(problems)]
    back = table_to_rows(rows_to_table(rows))
    assert record_task(back[0]).name == "qa"  # not math, whose question/answer columns it also holds
    assert [task.from_record(r) for r in back] == problems


def test_a_task_file_loads_and_a_bad_row_is_one_line_naming_row_and_field(tmp_path):
    task = get_task("qa")
    problems = task.generate(5, 4)
    good = tmp_path / "qa.jsonl"
    good.write_text("".join(json.dumps(task.to_record(p)) + "\n" for p in problems))
    assert task.load(str(good)) == problems
    for row, field in [({"question": "Q?", "paragraphs": ["x."]}, "answer"),
                       ({"question": "Q?", "answer": "Zed", "paragraphs": "x."}, "paragraphs"),
                       ({"question": "Q?", "answer": "Zed", "paragraphs": ["x."], "evidence": "some"}, "evidence"),
                       ({"question": "Q?", "answer": "Zed", "paragraphs": ["x."], "hops": 3}, "hops")]:
        bad = tmp_path / f"bad-{field}.jsonl"
        bad.write_text(json.dumps(task.to_record(problems[0])) + "\n" + json.dumps(row) + "\n")
        with pytest.raises(TaskFormatError) as err:
            task.load(str(bad))
        assert "\n" not in str(err.value) and "row 2" in str(err.value) and f"'{field}'" in str(err.value)


def test_prompts_the_one_turn_form_and_the_format_only_warm_start():
    task = get_task("qa")
    problems = task.generate(9, 6)
    p = problems[0]
    turn1 = task.turn1_messages(p)
    assert turn1[0]["content"] == task.system_prompt and "<answer>" in turn1[1]["content"]
    assert all(f"{i}. {para}" in turn1[1]["content"] for i, para in enumerate(p.paragraphs, 1))
    single = task.single_turn_messages(p)
    assert single[1] == turn1[1] and "<confidence>" in single[0]["content"] and "<confidence>" not in task.system_prompt
    ready = [q for q in problems if task.sft_problem(q) is not None]
    assert ready == [q for q in problems if q.evidence == "full"]  # no trace names a gold it cannot see
    examples = task.warm_start_examples(ready, seed=1, single_turn=True)
    assert [e["sample_type"] for e in examples] == ["answer", "confidence"] * len(ready) + ["answer"] * len(ready)
    for e in examples[:2 * len(ready):2]:
        assert task.score(e["completion"], e["task"], format_score=0.0) == 1.0
        assert all(s in e["completion"] for s in e["task"].support)
    confidences = [float(re.search(r"<confidence>(.*)</confidence>", e["completion"]).group(1))
                   for e in examples if "<confidence>" in e["completion"]]
    assert len(confidences) == 2 * len(ready) and set(confidences) <= set(FORMAT_ONLY_CONFIDENCES)


def test_the_held_out_set_holds_each_evidence_state_and_no_training_question():
    from rlcr.config import RLCRConfig
    from rlcr.runs.task_sets import sft_tasks, task_sets

    cfg = RLCRConfig(tasks={"name": "qa", "num_train": 90, "num_eval": 12})
    train, held_out = task_sets(cfg)
    task = get_task("qa")
    assert Counter(task.stratum(p) for p in held_out) == {"full": 4, "partial": 4, "none": 4}
    assert not {task.identity(p) for p in train} & {task.identity(p) for p in held_out}
    assert all(p.evidence == "full" for p in sft_tasks(cfg, 10, train))


def test_the_qa_config_loads():
    from pathlib import Path

    from rlcr.config import load_config

    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "qa.yaml")
    assert cfg.tasks.name == "qa" and cfg.model.name == "smollm2-135m-instruct"
    assert isinstance(get_task(cfg.tasks.name), QATask)
    # the readable form (docs/results.md): its held-out set is one-hop, two paragraphs, full or no evidence, and the
    # gold never in the context without its evidence
    read = load_config(Path(__file__).resolve().parents[1] / "configs" / "qa-read.yaml")
    task = get_task(read.tasks.name)
    held_out = task.generate(read.tasks.num_eval, read.tasks.eval_seed, read)
    assert {p.evidence for p in held_out} == {"full", "none"} and {p.hops for p in held_out} == {1}
    assert all(len(p.paragraphs) == 2 for p in held_out) and read.sft.tasks == 300
    assert all((p.evidence == "full") == any(p.answer in q for q in p.paragraphs) for p in held_out)


@pytest.mark.slow
def test_train_flow_on_qa(ray_local, prefect_harness, tiny_model_dir, tmp_path):
    from flows.train import rlcr_train
    from rlcr.config import RLCRConfig
    from rlcr.runs.store import RunStore

    overrides = {
        "tasks.name": "qa", "model.name": str(tiny_model_dir), "storage.uri": str(tmp_path / "store"),
        "tasks.num_train": 30, "tasks.num_eval": 3,
        "rollout.prompts_per_iteration": 2, "rollout.num_generations_answer": 2,
        "rollout.num_generations_confidence": 2, "eval.samples": 1, "rollout.temperature": 1.0,
        "rollout.max_answer_tokens": 16, "rollout.max_confidence_tokens": 8,
        "rollout.max_prompt_tokens": 960,  # the tiny model's tokenizer spells the paragraphs in ~3x SmolLM2's tokens
        "engine.max_model_len": 1024, "engine.kv_cache_gib": 0.25, "update.learning_rate": 1e-3,
        "orchestration.retries": 0,
    }
    assert rlcr_train(overrides=overrides, run_id="qa", iterations=1)["iterations"] == [1]
    run = RunStore.open(RLCRConfig.from_dict(overrides), "qa")
    (m1,) = run.committed()
    rows = pq.read_table(m1["rollouts_uri"]).to_pylist()
    assert {"question", "answer", "paragraphs", "evidence", "hops"} <= set(rows[0]) and "nums" not in rows[0]
    assert len(rows) == 2 * 2 * (1 + 2) and all(r["correct"] in (0.0, 1.0) for r in rows)
    ev = run.metrics(1)["eval"]
    assert ev["n_tasks"] == 3 and set(ev["by_count"]) == set(EVIDENCE_STATES)
    records = pq.read_table(ev["records_uri"]).to_pylist()
    assert {r["evidence"] for r in records} == set(EVIDENCE_STATES)


def _eval_rows(problems, right: set[int], confidences: dict[str, float]) -> list[dict]:
    """An evaluation's rows: one answer per problem (right for the indices in ``right``), one confidence each,
    the confidence by evidence state."""
    from rlcr.rollout.records import rollout_row

    rows = []
    for i, p in enumerate(problems):
        text = f"<answer>{p.answer if i in right else 'Nobody Atall'}</answer>"
        common = dict(task=p, prompt_id=i, answer_id=0, context_text=f"c{i}", context_ids=[1], completion_ids=[2],
                      task_name="qa", run_id="r", iteration=0, correct=float(i in right))
        rows.append(rollout_row("answer", completion_text=text, score=1.0 if i in right else 0.1, reward=0.0, **common))
        rows.append(rollout_row("confidence", confidence_id=0, completion_text="<confidence>c</confidence>",
                                confidence=confidences[p.evidence], reward=0.0, **common))
    return rows


def test_the_qa_report_gives_figures_and_paired_changes_per_evidence_state(tmp_path, capsys):
    from rlcr.evaluation.qa_report import main
    from rlcr.rollout.records import rows_to_table

    problems = get_task("qa").generate(30, 9)
    right = {i for i, p in enumerate(problems) if p.evidence == "full"} | {1}
    files = []
    for name, conf in (("a", {"full": 0.9, "partial": 0.3, "none": 0.2}),
                       ("b", {"full": 0.7, "partial": 0.7, "none": 0.7})):
        files.append(str(tmp_path / f"{name}.parquet"))
        pq.write_table(rows_to_table(_eval_rows(problems, right, conf)), files[-1])
    assert main(files) == 0
    report = json.loads(capsys.readouterr().out)
    a = report["A"]
    assert a["full"]["n_answers"] == 10 and a["full"]["accuracy"] == 1.0 and a["full"]["f1"] == 1.0
    assert a["none"]["accuracy"] == 0.0 and a["none"]["mean_confidence"] == pytest.approx(0.2)
    assert a["partial"]["accuracy"] == pytest.approx(0.1) and a["all"]["n_answers"] == 30
    assert a["full"]["brier"] == pytest.approx(0.01) and len(a["none"]["ci"]["brier"]) == 2
    d = report["A-B"]
    assert d["none"]["mean_confidence"]["difference"] == pytest.approx(-0.5)
    assert d["none"]["mean_confidence"]["ci"] == pytest.approx([-0.5, -0.5])
    assert d["full"]["mean_confidence"]["difference"] == pytest.approx(0.2)
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet")
    assert main([str(bad)]) == 1 and "bad.parquet" in capsys.readouterr().err


def test_from_record_reads_a_pandas_row():
    """The rollout stages read problems from pandas rows: list columns are NumPy arrays, a null is None or NaN."""
    import pandas as pd

    task = get_task("qa")
    problems = task.generate(3, 12)
    frame = pd.DataFrame([task.to_record(p) for p in problems])
    assert [task.from_record(r) for _, r in frame.iterrows()] == problems
    frame["support"] = [None, float("nan"), None]
    assert [task.from_record(r).support for _, r in frame.iterrows()] == [(), (), ()]
