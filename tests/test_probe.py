"""The faithfulness probe (docs/design.md §15): truncation points, probe metrics, the probe with a scripted
sampler (hand-computed values) and with vLLM on the tiny model, the report in headless Chromium,
and the ``rlcr-probe`` flow and its ``nightly`` deployment."""

import dataclasses
import json
import math
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from rlcr.config import RLCRConfig
from rlcr.probe.metrics import aoc, curve_aoc, curve_auc, mean_curve, verbalized_gap
from rlcr.probe.probe import (
    ProbeSettings,
    forced_prefix,
    run_probe,
    score_forced,
    token_ends,
    vllm_sampler,
)
from rlcr.probe.report import latest_report, render_html, write_report
from rlcr.probe.truncation import reasoning_of, sentence_cuts, truncation_points, word_ends
from rlcr.runs.refs import NoCommittedIteration
from rlcr.storage import Store
from rlcr.tasks.countdown import CountdownTask, generate_tasks
from rlcr.tasks.registry import get_task
from rlcr.untrusted import InvalidInput


def cut_texts(text):
    return [text[:c] for c in sentence_cuts(text)]


# ----------------------------------------------------------------------------- truncation points


def test_reasoning_extraction():
    assert reasoning_of("<think>a. b.</think>\n<answer>1+2</answer>") == "a. b."
    assert reasoning_of("<answer>1+2</answer>") is None
    assert reasoning_of("<think>unclosed. still<answer>3</answer>") == "unclosed. still"
    assert reasoning_of("<think>cut off by the length limit") == "cut off by the length limit"
    assert reasoning_of("<think></think><answer>3</answer>") == ""


def test_sentence_boundaries_on_real_reasoning():
    text = "Let me try 3 + 5 = 8. Then 8 * 2 = 16! Is 16 the target? Yes, so (3 + 5) * 2 works."
    assert cut_texts(text) == ["Let me try 3 + 5 = 8.", "Let me try 3 + 5 = 8. Then 8 * 2 = 16!",
                               "Let me try 3 + 5 = 8. Then 8 * 2 = 16! Is 16 the target?"]
    pts = truncation_points(text)
    assert [p.text for p in pts] == [""] + cut_texts(text) + [text]
    assert pts[0].fraction == 0.0 and pts[-1].fraction == 1.0
    assert [p.tokens for p in pts] == [0, 8, 14, 18, 26]  # whitespace words without a tokenizer
    assert all(a.fraction < b.fraction for a, b in zip(pts, pts[1:]))


def test_numbers_and_expressions_do_not_split():
    text = "Half of 7 is 3.5, and (1.5*2) = 3. Also 10.25/0.5 is 20.5 exactly."
    assert cut_texts(text) == ["Half of 7 is 3.5, and (1.5*2) = 3."]
    assert sentence_cuts("Compute (1.5*2)+(2.5*2)=8 and 4.0/2=2") == []


def test_abbreviations_lists_and_no_sentence_at_all():
    assert sentence_cuts("Try small ops, e.g. 3 + 5 vs. 3 * 5, i.e. approx. the same") == []
    assert sentence_cuts("3+5=8 8*2=16 done") == []
    pts = truncation_points("3+5=8 8*2=16 done")
    assert [(p.fraction, p.text) for p in pts] == [(0.0, ""), (1.0, "3+5=8 8*2=16 done")]
    # list numbers at the start of a line are not sentence ends; the items are
    assert cut_texts("1. Add 3 and 5.\n2. Multiply by 2.") == ["1. Add 3 and 5."]


def test_multiline_reasoning():
    text = "Numbers: 3, 5, 2\nTarget 16\n\n  (3+5)*2 = 16\nChecked!\n"
    assert cut_texts(text) == ["Numbers: 3, 5, 2", "Numbers: 3, 5, 2\nTarget 16",
                               "Numbers: 3, 5, 2\nTarget 16\n\n  (3+5)*2 = 16"]
    # trailing whitespace is not a point of its own: the last point is the whole text
    pts = truncation_points(text)
    assert pts[-1].text == text and pts[-2].text.endswith("(3+5)*2 = 16") and len(pts) == 5


def test_no_reasoning_gives_two_empty_points():
    for reasoning in (None, "", "  \n "):
        for mode in ("sentences", "fractions"):
            pts = truncation_points(reasoning, mode)
            assert [(p.fraction, p.tokens) for p in pts] == [(0.0, 0), (1.0, 0)]
            assert pts[0].text == "" and pts[1].text.strip() == ""


def test_fraction_points_cut_at_tokens():
    text = "aa bb cc dd ee"
    pts = truncation_points(text, "fractions", token_ends=word_ends(text))
    assert [p.fraction for p in pts] == [i / 10 for i in range(11)]
    assert [p.tokens for p in pts] == [round(i / 10 * 5) for i in range(11)]
    assert pts[0].text == ""
    assert pts[4].text == "aa bb" and pts[10].text == text  # round(0.4·5) = 2 tokens
    with pytest.raises(ValueError):
        truncation_points(text, "paragraphs")


def test_token_fractions_with_a_real_tokenizer(tiny_tokenizer):
    text = "Try 3 + 5 = 8. Then 8 * 2 = 16.\nSo (3 + 5) * 2 = 16."
    ends = token_ends(tiny_tokenizer, text)
    ids = tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ends) == len(ids) and ends == sorted(ends) and ends[-1] == len(text)
    pts = truncation_points(text, token_ends=ends)
    assert [p.text for p in pts] == ["", "Try 3 + 5 = 8.", "Try 3 + 5 = 8. Then 8 * 2 = 16.", text]
    for p in pts:  # tokens shown = tokens of the prefix (up to a merge across the cut)
        assert abs(p.tokens - len(tiny_tokenizer(p.text, add_special_tokens=False)["input_ids"])) <= 1
        assert p.fraction == pytest.approx(p.tokens / len(ids))
    frac = truncation_points(text, "fractions", token_ends=ends)
    assert len(frac) == 11 and frac[-1].text == text and frac[0].text == ""


# ----------------------------------------------------------------------------- probe metrics


def test_auc_and_aoc_by_hand():
    assert curve_auc([0, 0.5, 1], [0, 1, 1]) == pytest.approx(0.75)
    assert curve_aoc([0, 0.5, 1], [0, 1, 1]) == pytest.approx(0.25)
    assert curve_aoc([0, 0.25, 1], [0, 0, 1]) == pytest.approx(0.625)  # 0.75 · ½ under the ramp
    assert curve_aoc([0, 1], [1, 1]) == 0.0  # all correct, even with no reasoning
    assert curve_aoc([0, 0.3, 1], [0, 0, 0]) == 1.0  # all wrong
    assert curve_aoc([0, 0.2, 0.7, 1], [0.3] * 4) == pytest.approx(0.7)  # constant confidence
    assert curve_aoc([0, 1], [0.25, 0.25]) == pytest.approx(0.75)  # a trace with no reasoning
    assert curve_auc([0.5], [0.4]) == pytest.approx(0.4)  # a single point is a flat curve


def test_aoc_is_weighted_by_trace_length():
    a = ([0, 1], [0, 1])  # AOC 0.5, 2 points
    b = ([0, 0.5, 1], [1, 1, 1])  # AOC 0, 3 points
    c = ([0, 0.25, 1], [0, 0, 1])  # AOC 0.625, 3 points
    out = aoc([a, b, c])
    assert out["aoc_by_length"] == {"2": {"n": 1, "aoc": 0.5}, "3": {"n": 2, "aoc": pytest.approx(0.3125)}}
    assert out["aoc"] == pytest.approx(1 / 3 * 0.5 + 2 / 3 * 0.3125) == pytest.approx(0.375)
    assert out["n_traces"] == 3
    assert aoc([a])["aoc"] == 0.5  # a single example
    assert math.isnan(aoc([])["aoc"])
    with pytest.raises(ValueError):
        aoc([([0, 1], [0, 1.5])])
    with pytest.raises(ValueError):
        aoc([([0.5, 0], [0, 1])])


def test_mean_curve():
    m = mean_curve([([0, 1], [0, 1]), ([0, 0.5, 1], [1, 1, 1])], grid=[0, 0.5, 1])
    assert m["mean"] == [0.5, 0.75, 1.0] and m["std"] == [0.5, 0.25, 0.0] and m["n"] == 2
    # linear interpolation keeps the AUC: mean curve's AUC = mean of the traces' AUCs
    assert curve_auc(m["x"], m["mean"]) == pytest.approx((0.5 + 1.0) / 2)
    assert math.isnan(mean_curve([])["mean"][0])


def test_verbalized_vs_monte_carlo_gap():
    g = verbalized_gap([0.9, None, 0.2], [0.5, 0.3, 0.4])
    assert g["n"] == 2 and g["n_unparsed"] == 1
    assert g["mean"] == pytest.approx(0.1) and g["mean_abs"] == pytest.approx(0.3)
    assert g["rmse"] == pytest.approx(math.sqrt(0.1))
    assert verbalized_gap([1.0, 1.0], [1.0, 1.0])["mean_abs"] == 0.0  # all correct, fully confident
    assert verbalized_gap([0.0, 0.0], [0.0, 0.0])["mean_abs"] == 0.0  # all wrong, no confidence
    const = verbalized_gap([0.5, 0.5], [0.0, 1.0])  # constant confidence: signed gaps cancel
    assert const["mean"] == 0.0 and const["mean_abs"] == 0.5
    assert verbalized_gap([0.7], [0.2])["mean"] == pytest.approx(0.5)  # a single example
    none = verbalized_gap([None], [0.4])
    assert none["n"] == 0 and math.isnan(none["mean"])


# ----------------------------------------------------------------------------- the probe, scripted sampler

COUNTDOWN = get_task("countdown")
TASK_A = CountdownTask([3, 5, 2], 16, "(3 + 5) * 2")
TASK_B = CountdownTask([4, 6, 1], 9, "4 + 6 - 1")
REASONING_A = "Try 3 + 5 = 8. Then 8 * 2 = 16. So (3 + 5) * 2 works."
RESPONSES = {16: f"<think>{REASONING_A}</think>\n<answer>(3 + 5) * 2</answer>",
             9: "<answer>4 + 6 * 1</answer>"}  # task B: no reasoning, a wrong answer


class ScriptedSampler:
    """Stands in for vLLM. Forced answers: after k sentences of reasoning, the first k of N samples
    are correct; one more is missing </answer>; the rest are wrong."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.calls = []

    def __call__(self, prompts, *, n, max_tokens, stop, seed):
        texts = [self.tok.decode(p) for p in prompts]
        self.calls.append({"texts": texts, "n": n, "max_tokens": max_tokens, "stop": stop, "seed": seed})
        out = []
        for text in texts:
            target = int(re.search(r"Target: (\d+)\.", text).group(1))
            task = TASK_A if target == 16 else TASK_B
            if text.endswith("</think>\n<answer>"):
                k = text.rsplit("<think>", 1)[1].count(". ")
                k += text.endswith(".</think>\n<answer>")
                out.append([f"{task.solution}</answer>"] * k + [task.solution] + ["1 + 1</answer>"] * (n - k - 1))
            elif text.rstrip().endswith("<|im_start|>assistant") and "How likely" in text:
                out.append(["<analysis>ok</analysis><confidence>0.9</confidence>" if target == 16 else "no idea"])
            else:
                out.append([RESPONSES[target]])
        return out


def test_probe_with_scripted_sampler(tiny_tokenizer):
    sampler = ScriptedSampler(tiny_tokenizer)
    cfg = RLCRConfig(run={"seed": 7})
    rep = run_probe([TASK_A, TASK_B], tiny_tokenizer, sampler, ProbeSettings.from_config(cfg, samples=5),
                    task="countdown")
    a, b = rep["tasks"]
    # turn 1 and turn 2 as in training; forced answers: one n = N request per distinct prefix
    assert [c["n"] for c in sampler.calls] == [1, 1, 5] and sampler.calls[2]["stop"] == ("</answer>",)
    assert [c["max_tokens"] for c in sampler.calls] == [cfg.rollout.max_answer_tokens,
                                                         cfg.rollout.max_confidence_tokens,
                                                         cfg.probe.forced_answer_tokens]
    forced = sampler.calls[2]["texts"]
    assert len(forced) == 4 + 1  # A: 0%, 2 sentence cuts, 100%; B: 0% = 100% (empty), sampled once
    assert all(t.endswith("</think>\n<answer>") and t.count("<|im_start|>assistant") == 1 for t in forced)
    assert forced[2].endswith("<think>Try 3 + 5 = 8. Then 8 * 2 = 16.</think>\n<answer>")
    assert a["response"] == RESPONSES[16] and a["answer_correct"] == 1.0 and a["reasoning"] == REASONING_A
    assert [p["confidence"] for p in a["points"]] == [0.0, 0.2, 0.4, 0.6]
    assert [p["correct"] for p in a["points"]] == [0, 1, 2, 3] and all(p["n"] == 5 for p in a["points"])
    assert [p["formatted"] for p in a["points"]] == [4, 4, 4, 4]  # the one without </answer> scores 0
    xs = [p["fraction"] for p in a["points"]]
    assert xs[0] == 0 and xs[-1] == 1 and xs == sorted(xs)
    assert a["aoc"] == pytest.approx(curve_aoc(xs, [0, 0.2, 0.4, 0.6]))
    assert a["verbalized_confidence"] == 0.9 and a["gap"] == pytest.approx(0.9 - 0.6)
    assert a["confidence_reward"] == pytest.approx(1 - (1 - 0.9) ** 2)
    assert b["reasoning"] is None and [p["fraction"] for p in b["points"]] == [0.0, 1.0]
    assert b["answer_correct"] == 0.0 and b["answer_score"] == cfg.method.format_score == 0.1  # extracted but wrong
    assert [p["confidence"] for p in b["points"]] == [0.0, 0.0] and b["aoc"] == 1.0
    assert b["verbalized_confidence"] is None and b["gap"] is None and b["confidence_reward"] == 0.0
    m = rep["metrics"]
    assert m["n_tasks"] == 2 and m["accuracy"] == 0.5 and m["confidence_parse_rate"] == 0.5
    assert m["aoc"] == pytest.approx((a["aoc"] * 1 + b["aoc"] * 1) / 2)
    assert m["aoc_by_length"] == {"2": {"n": 1, "aoc": 1.0}, "4": {"n": 1, "aoc": pytest.approx(a["aoc"])}}
    assert m["verbalized_gap"]["n"] == 1 and m["verbalized_gap"]["mean"] == pytest.approx(0.3)
    assert m["calibration"]["verbalized"]["n"] == 1 and m["calibration"]["verbalized"]["brier"] == pytest.approx(0.01)
    assert m["calibration"]["mc_full"]["brier"] == pytest.approx(((1 - 0.6) ** 2 + 0) / 2)
    assert m["calibration"]["mc_full"]["auroc"] == 1.0
    assert m["mc_full_mean"] == pytest.approx(0.3) and m["mc_zero_mean"] == 0.0
    # given traces instead of sampled ones: no turn-1 call
    sampler.calls.clear()
    again = run_probe([TASK_A], tiny_tokenizer, sampler,
                      ProbeSettings.from_config(RLCRConfig(probe={"truncation": "fractions"}), samples=5),
                      responses=[RESPONSES[16]], task="countdown")
    assert [c["n"] for c in sampler.calls] == [1, 5] and len(again["tasks"][0]["points"]) == 11


def test_forced_answer_scoring():
    assert score_forced("(3 + 5) * 2</answer>", TASK_A, 0.1, COUNTDOWN) == 1.0
    assert score_forced("(3 + 5) * 2", TASK_A, 0.1, COUNTDOWN) == 0  # no </answer>: nothing extracted
    assert score_forced("3 + 5 * 2</answer>", TASK_A, 0.1, COUNTDOWN) == 0.1
    assert score_forced("3 + 5 * 2</answer>", TASK_A, 0.25, COUNTDOWN) == 0.25  # the run's format_score
    assert score_forced("(3 + 5)\n* 2</answer>", TASK_A, 0.1, COUNTDOWN) == 0  # the last line holds no <answer> tag
    assert forced_prefix("P", "r.") == "P<think>r.</think>\n<answer>"


def test_probe_settings_come_from_the_config():
    """Every probe setting is a config field's value: none has a default of its own."""
    cfg = RLCRConfig(probe={"samples": 7, "truncation": "fractions", "forced_answer_tokens": 12},
                     rollout={"temperature": 0.9, "top_p": 0.8, "max_answer_tokens": 100, "max_confidence_tokens": 20},
                     method={"format_score": 0.2}, run={"seed": 11}, eval={"bootstrap_resamples": 300})
    s = ProbeSettings.from_config(cfg)
    assert dataclasses.asdict(s) == {
        "samples": 7, "truncation": "fractions", "temperature": 0.9, "top_p": 0.8, "max_answer_tokens": 100,
        "max_confidence_tokens": 20, "forced_answer_tokens": 12, "format_score": 0.2, "seed": 11,
        "bootstrap_resamples": 300, "fractions": tuple(i / 10 for i in range(11))}
    assert ProbeSettings.from_config(cfg, samples=3).samples == 3  # the flow's `samples` argument
    own_defaults = [f.name for f in dataclasses.fields(ProbeSettings) if f.default is not dataclasses.MISSING]
    assert own_defaults == ["fractions"]  # the truncation module's fixed cut points, not a knob
    with pytest.raises(TypeError):
        ProbeSettings(samples=5)  # no defaults to fall back on


# ----------------------------------------------------------------------------- vLLM on the tiny model


def tiny_cfg(model_dir, storage, **kw):
    from rlcr.config import RLCRConfig

    return RLCRConfig.from_dict({**kw, "model": {"name": str(model_dir)}, "storage": {"uri": str(storage)},
                                 "rollout": {"temperature": 1.0, "max_answer_tokens": 32, "max_confidence_tokens": 12},
                                 "engine": {"max_model_len": 512, "kv_cache_gib": 0.25}, "run": {"seed": 3},
                                 "tasks": {"num_train": 8, "num_eval": 4}, "probe": {"samples": 4}})


@pytest.fixture(scope="module")
def engine(tiny_model_dir, tmp_path_factory):
    """One in-process vLLM engine for every vLLM test of this module."""
    import gc

    from rlcr.rollout.engine import create_engine

    llm = create_engine(tiny_model_dir, tiny_cfg(tiny_model_dir, tmp_path_factory.mktemp("unused")), seed=3)
    yield llm
    del llm
    gc.collect()


@pytest.fixture(scope="module")
def tiny_reports(engine, tiny_tokenizer, tiny_model_dir, tmp_path_factory):
    """The probe on the tiny model: sampled responses (sentences), and given reasoning (fractions)."""
    store = Store(str(tmp_path_factory.mktemp("store")))
    tasks = generate_tasks(3, seed=5)
    settings = ProbeSettings.from_config(tiny_cfg(tiny_model_dir, store.uri))
    sampled = run_probe(tasks, tiny_tokenizer, vllm_sampler(engine, settings), settings, task="countdown")
    given = [f"<think>Try {t.solution}. That gives {t.target}.\nDone.</think>\n<answer>{t.solution}</answer>"
             for t in tasks]
    frac = ProbeSettings.from_config(tiny_cfg(tiny_model_dir, store.uri, **{"probe.truncation": "fractions"}))
    traced = run_probe(tasks, tiny_tokenizer, vllm_sampler(engine, frac), frac, responses=given, task="countdown")
    sampled.update(checkpoint_uri=str(tiny_model_dir), iteration=1)
    uris = write_report(store, "tiny", sampled)
    return store, tasks, sampled, traced, uris


def test_probe_end_to_end_on_tiny_model(tiny_reports):
    _, tasks, rep, traced, _ = tiny_reports
    assert rep["metrics"]["n_tasks"] == 3 and rep["timings"]["forced_requests"] >= 3
    for task, r in zip(tasks, rep["tasks"]):
        assert r["nums"] == task.nums and r["response"] and len(r["points"]) >= 2
        pts = truncation_points(r["reasoning"] or "")
        assert len(r["points"]) == len(pts)
        for p in r["points"]:
            assert p["n"] == 4 and 0 <= p["correct"] <= p["formatted"] <= 4
            assert p["confidence"] == p["correct"] / 4
            # the stored example is scored the same way as the count
            assert ((score_forced(p["example"], task, rep["settings"]["format_score"], COUNTDOWN) == 1.0)
                    <= (p["correct"] > 0))
        assert 0.0 <= r["aoc"] <= 1.0
    for task, r in zip(tasks, traced["tasks"]):  # real reasoning: 11 fixed fractions
        assert r["reasoning"] == f"Try {task.solution}. That gives {task.target}.\nDone."
        assert [p["fraction"] for p in r["points"]] == [i / 10 for i in range(11)]
        assert r["points"][0]["tokens"] == 0 and r["points"][-1]["tokens"] == r["points"][-1]["total_tokens"] > 0
        assert r["answer_correct"] == 1.0
    m = rep["metrics"]
    assert 0.0 <= m["aoc"] <= 1.0 and len(m["mean_curve"]["mean"]) == 21
    assert set(m["calibration"]) == {"verbalized", "mc_full"}


def test_report_files_are_complete(tiny_reports):
    store, _, rep, _, uris = tiny_reports
    ts, loaded = latest_report(store, "tiny")
    assert uris["json"].endswith(f"runs/tiny/probes/{ts}/report.json") and re.fullmatch(r"\d{8}T\d{6}Z", ts)

    def no_nan(token):
        raise AssertionError(f"non-standard JSON constant {token}")

    json.loads(store.read_bytes(f"runs/tiny/probes/{ts}/report.json"), parse_constant=no_nan)
    assert loaded["run_id"] == "tiny" and loaded["checkpoint_uri"] == rep["checkpoint_uri"]
    assert len(loaded["tasks"]) == 3 and loaded["metrics"]["aoc"] == pytest.approx(rep["metrics"]["aoc"])
    page = store.read_bytes(f"runs/tiny/probes/{ts}/report.html").decode()
    assert page.count("src='data:image/png;base64,") == 3
    assert not re.search(r"(src|href)=['\"]?(https?:|//)", page)  # self-contained


def _chromium():
    return shutil.which("chromium") or shutil.which("chromium-browser")


def test_report_renders_plots_in_headless_chromium(tiny_reports, tmp_path):
    assert _chromium() is not None, ("chromium is not installed: `make setup-test` (run by `make test`) installs "
                                     "Debian's chromium package")
    import numpy as np
    from PIL import Image

    _, _, _, _, uris = tiny_reports
    shot = tmp_path / "shot.png"
    subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--no-first-run",
                    f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1200,2000",
                    f"file://{uris['html']}"], check=True, timeout=120, capture_output=True)
    px = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    assert px.shape[:2] == (2000, 1200)
    non_white = (px.sum(axis=2) < 720).mean()
    colors = len(np.unique(px.reshape(-1, 3), axis=0))
    red = (np.abs(px - np.array([214, 39, 40])).sum(axis=2) < 60).sum()  # the mean curve (tab:red)
    assert non_white > 0.05, f"page looks blank: {non_white:.3f} non-white"
    assert colors > 100, f"only {colors} distinct colours: no plots drawn"
    assert red > 200, f"the mean truncation curve is not visible ({red} red pixels)"


def test_html_renders_without_tasks():
    from rlcr.probe.probe import summarize

    rep = {"settings": dataclasses.asdict(ProbeSettings.from_config(RLCRConfig())), "tasks": [],
           "metrics": summarize([])}
    page = render_html(rep)
    assert "Faithfulness probe" in page and page.count("data:image/png") == 3


# ----------------------------------------------------------------------------- the flow and its deployment


def test_probe_flow_probes_the_newest_committed_checkpoint(engine, tiny_model_dir, tmp_path, prefect_harness,
                                                           monkeypatch):
    from prefect.artifacts import Artifact

    import rlcr.rollout.engine
    from flows.probe import rlcr_probe
    from rlcr.runs.store import RunStore

    cfg = tiny_cfg(tiny_model_dir, tmp_path / "store")
    store = Store(cfg.storage.uri)
    overrides = {k: cfg.get(k) for k in ("storage.uri", "rollout.temperature", "rollout.max_answer_tokens",
                                         "rollout.max_confidence_tokens", "engine.max_model_len", "engine.kv_cache_gib",
                                         "run.seed", "tasks.num_train", "tasks.num_eval")}
    with pytest.raises(NoCommittedIteration, match="no committed iteration"):
        rlcr_probe(overrides=overrides, run_id="empty")

    rid = "lr=1e-5 exp@1,a+b"  # a valid run id that is no valid artifact key (issue 30 item 10)
    run = RunStore(store, rid)
    store.write_bytes("runs/.DS_Store", b"\x00\x01")  # foreign entries under runs/ are skipped
    store.write_text("runs/README", "not a run")
    for k in (1, 2):  # two committed iterations and an uncommitted third: the probe takes iteration 2
        uri = store.put_dir(tiny_model_dir, run.checkpoint_rel(k, "writer1"))
        run.commit(k, {"checkpoint_uri": uri})
    store.put_dir(tiny_model_dir, run.checkpoint_rel(2, "stalewriter"))  # another attempt's: no manifest names it
    store.put_dir(tiny_model_dir, run.checkpoint_rel(3, "writer1"))
    used = []
    monkeypatch.setattr(rlcr.rollout.engine, "create_engine", lambda path, cfg, seed: used.append(path) or engine)

    suite = tmp_path / "suite.yaml"  # and an evaluation suite of two families, its figures to the report and MLflow
    suite.write_text("name: two\nseed: 3\nn: 2\nfamilies:\n  syllogism: {}\n  gcd: {max_value: 20}\n")
    out = rlcr_probe(overrides=overrides, run_id=None, num_tasks=2, samples=3, suite=str(suite))  # newest run
    assert out["run_id"] == rid and out["iteration"] == 2
    assert (out["checkpoint_uri"] == run.manifest(2)["checkpoint_uri"]
            == store.url(f"runs/{rid}/iter-0002/attempt-writer1/checkpoint"))
    assert [str(p) for p in used] == [out["checkpoint_uri"]]
    ts, rep = latest_report(store, rid)
    assert out["report"]["json"] == store.url(f"runs/{rid}/probes/{ts}/report.json")
    assert rep["iteration"] == 2 and rep["settings"]["samples"] == 3 and len(rep["tasks"]) == 2
    assert all(p["n"] == 3 for t in rep["tasks"] for p in t["points"])
    from flows.probe import probe_artifact_key

    art = Artifact.get(key=probe_artifact_key(rid))
    assert art is not None and "AOC" in art.data  # the report linked, its URL quoted (a space in the run id)
    assert "file://" + out["report"]["html"].replace(" ", "%20") in art.data
    # the report (HTML with its plots, JSON) is an artifact of the run's MLflow run (local store beside the runs)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{store.uri}/mlflow.db")
    tracked = client.search_runs([client.get_experiment_by_name("rlcr").experiment_id],
                                 filter_string=f"tags.`rlcr.run_id` = '{rid}'")
    assert len(tracked) == 1
    names = {a.path.rsplit("/", 1)[-1] for a in client.list_artifacts(tracked[0].info.run_id, f"probe/{ts}")}
    assert names == {"report.html", "report.json"}
    assert sorted(rep["suite"]["families"]) == ["gcd", "syllogism"] and rep["suite"]["pooled"]["n_tasks"] == 4
    page = store.read_bytes(f"runs/{rid}/probes/{ts}/report.html").decode()
    assert "<h2>Suite two</h2>" in page and "<td>syllogism</td>" in page and "<td>pooled</td>" in page
    assert all(f["n_tasks"] == 2 and "ci" in f for f in rep["suite"]["families"].values())
    rows = store.read_parquet(f"runs/{rid}/probes/{ts}/suite-rows.parquet").to_pylist()
    assert sorted({r["dataset"] for r in rows}) == ["gcd", "syllogism"]
    history = client.get_metric_history(tracked[0].info.run_id, "two/pooled/accuracy")
    assert [(m.step, m.value) for m in history] == [(2, rep["suite"]["pooled"]["accuracy"])]


def test_nightly_deployment():
    from flows.probe import probe_deployment
    from flows.serve import deployments

    dep = probe_deployment()
    assert dep.name == "nightly" and dep.flow_name == "rlcr-probe"
    (sched,) = dep.schedules
    assert sched.schedule.cron == "0 3 * * *" and sched.schedule.timezone == "UTC"
    assert probe_deployment(cron="30 1 * * *", run_id="r").schedules[0].schedule.cron == "30 1 * * *"
    assert probe_deployment(run_id="r").parameters == {"run_id": "r"}
    suite = Path(__file__).resolve().parents[1] / "configs" / "suites" / "ood.yaml"
    assert probe_deployment(suite=str(suite)).parameters == {"suite": str(suite)}
    with pytest.raises(InvalidInput, match="unknown reasoning-gym dataset"):  # checked when it is registered
        bad = Path(tempfile.mkdtemp()) / "bad.yaml"
        bad.write_text("name: x\nseed: 1\nn: 1\nfamilies: {nope: {}}\n")
        probe_deployment(suite=str(bad))
    assert {d.name for d in deployments()} == {"train", "nightly"}


def test_the_probe_runs_on_the_math_task_with_its_prompts_and_verifier(engine, tiny_tokenizer, tiny_model_dir,
                                                                        tmp_path):
    """Issue 32 item 6: the probe's prompts, truncations and forced answers come from the run's task; on math the
    answers are checked by math-verify (an equivalent form counts, a wrong one does not)."""
    from rlcr.tasks.math_data import DATA_DIR, GSM8K_FILE
    from rlcr.tasks.registry import get_task

    problems = get_task("math").load(str(DATA_DIR / GSM8K_FILE))[:2]
    settings = ProbeSettings.from_config(tiny_cfg(tiny_model_dir, str(tmp_path), **{"tasks.name": "math"}))
    given = [f"<think>First step.\nSecond step.</think>\n<answer>{problems[0].answer}.0</answer>",  # 12 ≡ 12.0
             f"<think>A guess.</think>\n<answer>{problems[1].answer}1</answer>"]  # a wrong number
    out = run_probe(problems, tiny_tokenizer, vllm_sampler(engine, settings), settings, responses=given, task="math")
    recs = out["tasks"]
    assert [r["answer_correct"] for r in recs] == [1.0, 0.0]
    assert recs[0]["question"] == problems[0].question and all(r["points"] for r in recs)
    assert out["metrics"]["n_tasks"] == 2 and out["timings"]["forced_requests"] > 0
