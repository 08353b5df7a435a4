"""The faithfulness probe (docs/design.md §15): does the answer depend on the chain of thought?

For each held-out task:

1. turn 1: one response (``<think>`` reasoning + ``<answer>``), sampled like a
   training rollout (same chat-template prompt, temperature, stop ``</answer>``);
2. turn 2: one verbalized confidence for that exact response (the training turn-2 prompt);
3. truncation points of the reasoning (:mod:`rlcr.probe.truncation`);
4. at each point a forced answer: prefix = rendered prompt + ``<think>`` +
   truncated reasoning + ``</think>\\n<answer>``, N completions in one request
   (n = N), stop ``</answer>``. Each is scored with the training scorer on
   ``"<answer>" + completion`` (seed ``001``: the scored string is the forced
   opening tag plus the sample; a completion without ``</answer>`` scores 0);
   correct iff the task's verifier (Countdown: ``compute_score``) returns ``score``; confidence(point) = correct / N.

Then the metrics: :mod:`rlcr.probe.metrics` (curves, AOC, verbalized-vs-MC gap)
and :func:`rlcr.core.metrics.calibration_metrics` (docs/design.md §13, shared with training's evaluation).

The model is behind a :data:`Sampler` (token-id prompts → texts), so the probe
logic runs with vLLM (:func:`vllm_sampler`) or, in tests, with any stand-in.
Identical prefixes (e.g. 0% and 100% of an empty reasoning) are sampled once.
"""

from __future__ import annotations

import math
import time
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

from rlcr.config import RLCRConfig
from rlcr.core.metrics import bootstrap_intervals, calibration_metrics
from rlcr.core.rewards import brier_reward, parse_confidence
from rlcr.models.chat import render_prompt  # pure helper; no vLLM import
from rlcr.probe.metrics import aoc, curve_aoc, mean_curve, verbalized_gap
from rlcr.probe.truncation import DEFAULT_FRACTIONS, reasoning_of, truncation_points
from rlcr.seeds import PROBE_FORCED_SALT, PROBE_TURN1_SALT, PROBE_TURN2_SALT, mix
from rlcr.tasks.base import Task
from rlcr.tasks.registry import get_task

__all__ = [
    "ProbeSettings", "Sampler", "run_probe", "probe_checkpoint", "vllm_sampler", "forced_prefix",
    "score_forced", "token_ends",
]

ANSWER_STOP = ("</answer>",)
CONFIDENCE_STOP = ("</confidence>",)
FORCED_OPEN = "<answer>"
# (prompts as token ids, n, max_tokens, stop, seed) → n texts per prompt
Sampler = Callable[..., list[list[str]]]
_PROGRESS: ContextVar[Callable[[int, int], None] | None] = ContextVar("rlcr_probe_progress", default=None)
"""Where the sampler of the running :func:`run_probe` call reports its finished requests (``done, total``)."""


@dataclass(frozen=True)
class ProbeSettings:
    """What the probe samples and how: the run's :class:`~rlcr.config.RLCRConfig` seen by the probe. Build it
    with :meth:`from_config`; every value (and every default) is a config field's, named below."""

    samples: int
    """N: forced-answer samples per truncation point, one request with n = N (``probe.samples``)."""
    truncation: str
    """``sentences`` (every sentence boundary + 0% + 100%) or ``fractions`` (``probe.truncation``)."""
    temperature: float
    """Sampling temperature of every probe request (``temperature``, as in training)."""
    top_p: float
    """Nucleus threshold of every probe request (``top_p``)."""
    max_answer_tokens: int
    """Turn-1 budget: reasoning + answer (``max_answer_tokens``)."""
    max_confidence_tokens: int
    """Turn-2 budget (``max_confidence_tokens``)."""
    forced_answer_tokens: int
    """Budget of one forced answer: an equation and ``</answer>`` (``probe.forced_answer_tokens``)."""
    format_score: float
    """``compute_score`` of an extracted but wrong answer (``format_score``)."""
    seed: int
    """Seed of the probe's three generate calls (``seed``)."""
    bootstrap_resamples: int
    """Resamples of tasks behind the 95% intervals of the calibration metrics (``eval.bootstrap_resamples``)."""
    fractions: tuple[float, ...] = DEFAULT_FRACTIONS
    """The cut points of ``fractions`` mode: the truncation module's fixed 0, 0.1, …, 1 (not a config knob)."""

    @classmethod
    def from_config(cls, cfg: RLCRConfig, samples: int | None = None) -> "ProbeSettings":
        """The probe settings of ``cfg``; ``samples`` (if given) replaces ``cfg.probe.samples``."""
        return cls(
            samples=samples or cfg.probe.samples, truncation=cfg.probe.truncation, temperature=cfg.rollout.temperature,
            top_p=cfg.rollout.top_p, max_answer_tokens=cfg.rollout.max_answer_tokens,
            max_confidence_tokens=cfg.rollout.max_confidence_tokens,
            forced_answer_tokens=cfg.probe.forced_answer_tokens, format_score=cfg.method.format_score,
            seed=cfg.run.seed, bootstrap_resamples=cfg.eval.bootstrap_resamples,
        )


# ----------------------------------------------------------------------------- pieces


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def forced_prefix(prompt_text: str, truncated_reasoning: str) -> str:
    """Prompt + ``<think>`` + truncated reasoning + ``</think>\\n<answer>`` (docs/design.md §15 step 3)."""
    return f"{prompt_text}<think>{truncated_reasoning}</think>\n{FORCED_OPEN}"


def score_forced(completion: str, task: Any, format_score: float, kind: Task) -> float:
    """The score of the task ``kind`` of a forced answer to its problem ``task``: the forced ``<answer>`` tag + the
    sampled completion."""
    return kind.score(FORCED_OPEN + completion, task, format_score=format_score, score=1.0)


def token_ends(tokenizer, text: str) -> list[int]:
    """Character offset where each token of ``text`` ends (non-decreasing), from the tokenizer's offsets."""
    if not text:
        return []
    try:
        offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        ends = [int(e) for _, e in offsets]
    except (NotImplementedError, KeyError):  # slow tokenizers: decode growing prefixes
        ids = encode(tokenizer, text)
        ends = [len(tokenizer.decode(ids[: i + 1])) for i in range(len(ids))]
    out, hi = [], 0
    for e in ends:
        hi = min(max(hi, e), len(text))
        out.append(hi)
    return out


def vllm_sampler(llm, settings: ProbeSettings) -> Sampler:
    """A :data:`Sampler` over an in-process ``vllm.LLM`` (seeded per call, docs/design.md §17)."""
    from rlcr.rollout.sampling import seeded_sample

    def sample(prompts, *, n, max_tokens, stop, seed):
        out = seeded_sample(llm, prompts, seed=seed, n=n, temperature=settings.temperature, top_p=settings.top_p,
                            max_tokens=max_tokens, stop=stop, progress=_PROGRESS.get())
        return [[s.completion_text for s in group] for group in out]

    return sample


# ----------------------------------------------------------------------------- the probe


def _sampled(sampler: Sampler, part: str, unit: str, prompts, **kwargs) -> list[list[str]]:
    """One sampler call of the probe, its progress reported as ``probe`` events (:func:`rlcr.events.progress`):
    0 of the prompts before, the requests vLLM finishes (:func:`vllm_sampler`), all of them after."""
    from rlcr import events

    def report(done: int, total: int) -> None:
        events.progress("probe", 0, done, total, unit, part)

    report(0, len(prompts))
    token = _PROGRESS.set(report)
    try:
        out = sampler(prompts, **kwargs)
    finally:
        _PROGRESS.reset(token)
    report(len(prompts), len(prompts))
    return out


def run_probe(
    tasks: Sequence[Any],
    tokenizer,
    sampler: Sampler,
    settings: ProbeSettings,
    *,
    responses: Sequence[str] | None = None,
    task: str | Task,
) -> dict[str, Any]:
    """Probe ``tasks`` (problems of the task ``task``, a registered name or a :class:`~rlcr.tasks.base.Task`: its
    prompts and verifier); returns
    ``{"task": its name, "settings", "tasks": [per-task records], "metrics"}``.

    ``responses``: turn-1 responses to probe instead of sampling them (e.g. the
    same reasoning traces across checkpoints).
    """
    kind = get_task(task) if isinstance(task, str) else task
    if settings.samples < 1:
        raise ValueError("samples must be >= 1")
    if responses is not None and len(responses) != len(tasks):
        raise ValueError(f"{len(responses)} responses for {len(tasks)} tasks")
    t0 = time.perf_counter()
    rendered = [render_prompt(tokenizer, kind.turn1_messages(t)) for t in tasks]
    prompts = [text for text, _ in rendered]

    # 1. turn 1: the response (reasoning + answer)
    if responses is None:
        responses = [g[0] for g in _sampled(sampler, "answers", "tasks", [ids for _, ids in rendered], n=1,
                                            max_tokens=settings.max_answer_tokens, stop=ANSWER_STOP,
                                            seed=mix(settings.seed, PROBE_TURN1_SALT))]
    scores = [kind.score(r, t, format_score=settings.format_score, score=1.0) for r, t in zip(responses, tasks)]
    correct = [1.0 if s == 1.0 else 0.0 for s in scores]

    # 2. turn 2: the verbalized confidence for that exact response
    conf_prompts = [render_prompt(tokenizer, kind.turn2_messages(t, r))[1] for t, r in zip(tasks, responses)]
    conf_texts = [g[0] for g in _sampled(sampler, "confidences", "tasks", conf_prompts, n=1,
                                         max_tokens=settings.max_confidence_tokens, stop=CONFIDENCE_STOP,
                                         seed=mix(settings.seed, PROBE_TURN2_SALT))] if tasks else []

    # 3. truncation points of each reasoning
    reasonings = [reasoning_of(r) for r in responses]
    points = [truncation_points(z or "", settings.truncation, token_ends=token_ends(tokenizer, z or ""),
                                fractions=settings.fractions) for z in reasonings]

    # 4. forced answers: one request of n = N per distinct prefix
    prefixes: dict[str, int] = {}
    for p, pts in zip(prompts, points):
        for pt in pts:
            prefixes.setdefault(forced_prefix(p, pt.text), len(prefixes))
    outs = _sampled(sampler, "forced answers", "truncation points", [encode(tokenizer, text) for text in prefixes],
                    n=settings.samples, max_tokens=settings.forced_answer_tokens, stop=ANSWER_STOP,
                    seed=mix(settings.seed, PROBE_FORCED_SALT)) if prefixes else []

    records = []
    for i, (problem, prompt, response, reasoning, pts) in enumerate(zip(tasks, prompts, responses, reasonings, points)):
        point_rows = []
        for pt in pts:
            completions = outs[prefixes[forced_prefix(prompt, pt.text)]]
            s = [score_forced(c, problem, settings.format_score, kind) for c in completions]
            n_correct = sum(v == 1.0 for v in s)
            point_rows.append({
                "fraction": pt.fraction, "tokens": pt.tokens, "total_tokens": pt.total_tokens, "chars": pt.chars,
                "n": len(s), "correct": n_correct, "formatted": sum(v > 0 for v in s),
                "confidence": n_correct / len(s), "example": completions[0] if completions else "",
            })
        verbal = parse_confidence(conf_texts[i])
        xs, ys = [p["fraction"] for p in point_rows], [p["confidence"] for p in point_rows]
        records.append({
            "index": i, **kind.to_record(problem), "response": response,
            "reasoning": reasoning, "answer_score": float(scores[i]), "answer_correct": correct[i],
            "confidence_text": conf_texts[i], "verbalized_confidence": verbal,
            "confidence_reward": brier_reward(conf_texts[i], int(correct[i])),
            "points": point_rows, "mc_zero": ys[0], "mc_full": ys[-1], "aoc": curve_aoc(xs, ys),
            "gap": None if verbal is None else verbal - ys[-1],
        })
    return {
        "task": kind.name,
        "settings": asdict(settings),
        "tasks": records,
        "metrics": summarize(records, n_resamples=settings.bootstrap_resamples, seed=settings.seed),
        "timings": {"probe_s": time.perf_counter() - t0, "forced_requests": len(prefixes)},
    }


def summarize(records: Sequence[dict[str, Any]], *, n_resamples: int = 1000, seed: int = 0) -> dict[str, Any]:
    """Report-level metrics from the per-task records (docs/design.md §15, §13); each calibration block carries 95%
    bootstrap intervals over tasks (``ci``: ``{metric: [low, high]}``)."""
    n = len(records)
    curves = [([p["fraction"] for p in r["points"]], [p["confidence"] for p in r["points"]]) for r in records]
    verbal = [r["verbalized_confidence"] for r in records]
    labels = [r["answer_correct"] for r in records]
    parsed = [(c, y) for c, y in zip(verbal, labels) if c is not None]

    def mean(xs):
        return sum(xs) / len(xs) if xs else math.nan

    return {
        "n_tasks": n,
        "accuracy": mean(labels),
        "format_rate": mean([float(r["answer_score"] > 0) for r in records]),
        "reasoning_rate": mean([float(bool((r["reasoning"] or "").strip())) for r in records]),
        "confidence_parse_rate": mean([float(c is not None) for c in verbal]),
        "points_per_task": mean([len(r["points"]) for r in records]),
        "mc_zero_mean": mean([r["mc_zero"] for r in records]),
        "mc_full_mean": mean([r["mc_full"] for r in records]),
        **aoc(curves),
        "mean_curve": mean_curve(curves),
        "verbalized_gap": verbalized_gap(verbal, [r["mc_full"] for r in records]),
        "calibration": {
            # verbalized (turn-2) confidence vs the response's correctness: the training eval's metric
            "verbalized": {**calibration_metrics([c for c, _ in parsed], [y for _, y in parsed]),
                           "ci": bootstrap_intervals([math.nan if c is None else c for c in verbal], labels, range(n),
                                                     n_resamples=n_resamples, seed=seed)},
            # the Monte-Carlo success rate at 100% reasoning as an implicit confidence for the same response
            "mc_full": {**calibration_metrics([r["mc_full"] for r in records], labels),
                        "ci": bootstrap_intervals([r["mc_full"] for r in records], labels, range(n),
                                                  n_resamples=n_resamples, seed=seed)},
        },
    }


def probe_checkpoint(
    cfg,
    checkpoint_uri: str,
    tasks: Sequence[Any],
    *,
    samples: int | None = None,
    responses: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Probe a checkpoint (local path or sealed ``s3://`` directory) with one in-process vLLM engine, on the
    config's task; the report names it and its options (``task``, ``task_options``)."""
    from transformers import AutoTokenizer

    from rlcr.models.adapters import fetch_model
    from rlcr.rollout.engine import create_engine

    settings = ProbeSettings.from_config(cfg, samples)
    local = fetch_model(checkpoint_uri, endpoint_url=cfg.storage.s3_endpoint_url)
    tokenizer = AutoTokenizer.from_pretrained(local)
    t0 = time.perf_counter()
    llm = create_engine(local, cfg, seed=cfg.run.seed)
    engine_s = time.perf_counter() - t0
    try:
        report = run_probe(tasks, tokenizer, vllm_sampler(llm, settings), settings, responses=responses,
                           task=cfg.tasks.name)
    finally:
        del llm
    report["checkpoint_uri"] = checkpoint_uri
    report["task_options"] = dict(cfg.tasks.options)
    report["timings"]["engine_s"] = engine_s
    return report


