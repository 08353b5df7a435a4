"""One iteration's rollouts on Ray Data: both vLLM stages, scoring, advantages, Parquet (docs/design.md §1).

``run_rollouts`` builds the dataset pipeline, collects the tree on the driver
(advantages need whole groups), assigns advantages, validates the tree and writes
``<storage>/runs/<run_id>/iter-<k>/rollouts/rollouts.parquet``.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from rlcr import seeds
from rlcr.config import RLCRConfig
from rlcr.core.methods import method_record
from rlcr.rollout.records import assign_advantages, rows_to_table, validate_rollouts
from rlcr.rollout.stages import (
    AnswerStage,
    ConfidenceStage,
    answer_batch,
    confidence_batch,
    expand_to_turn2,
    score_answers,
    score_confidences,
)
from rlcr.runs.cluster import ENGINE_ACTOR_CPUS, STAGE_ACTOR_CPUS
from rlcr.runs.layout import RunLayout
from rlcr.tasks.registry import get_task

__all__ = [
    "RolloutResult", "build_rollout_dataset", "to_records", "run_rollouts", "generate_rollouts", "finalize_rollouts",
    "rollout_seed", "rollout_stats", "check_prompt_lengths", "STAGES_ENV", "stage_compute",
]

STAGES_ENV = "RLCR_ROLLOUT_STAGES"
"""How the two generation stages run with shared engines: ``tasks`` (default; plain functions in Ray's reused
worker processes) or ``actors`` (a pool of stage actors started for every dataset, the former way: seconds per
iteration, docs/iteration-overhead.md; kept to compare, e.g. by bench/perf/iteration.py). Read when a dataset is
built. Stages that own their engine are always actors."""
STAGE_COMPUTES = ("tasks", "actors")


def stage_compute(engines) -> str:
    """``tasks`` or ``actors``: how a dataset built now runs its generation stages (:data:`STAGES_ENV`)."""
    if not engines:
        return "actors"
    mode = os.environ.get(STAGES_ENV, "").strip().lower() or "tasks"
    if mode not in STAGE_COMPUTES:
        raise ValueError(f"${STAGES_ENV}={mode!r}: expected one of {', '.join(STAGE_COMPUTES)}")
    return mode


@dataclass
class RolloutResult:
    rows: list[dict[str, Any]]
    uri: str | None
    timings: dict[str, float] = field(default_factory=dict)
    stats: dict[str, float] = field(default_factory=dict)


def rollout_seed(cfg: RLCRConfig, iteration: int) -> int:
    """Seed of an iteration's rollouts (:func:`rlcr.seeds.rollout_seed` of the run's seed), from which each
    sample's request seed is derived (:func:`rlcr.seeds.answer_seed`, :func:`~rlcr.seeds.confidence_seed`)."""
    return seeds.rollout_seed(cfg.run.seed, iteration)


def build_rollout_dataset(
    cfg: RLCRConfig,
    tasks: Sequence[tuple[int, Any]],
    policy_uri: str,
    iteration: int,
    *,
    engines: list[str] | None = None,
    g_a: int | None = None,
    g_c: int | None = None,
    salt: int = 0,
    confidences: bool | None = None,
    temperature: float | None = None,
):
    """The lazy Ray Dataset of one iteration's rollout tree (answer and confidence rows).

    Every sample has its own request seed, derived from (run seed, iteration, ``salt``, stage, the row's
    prompt/answer id and sample index): the tree does not depend on how Ray Data bundles the rows, on
    ``rollout.batch_size``, on timing or on the number of engines; log-probs up to float rounding
    (docs/reproducibility.md).

    ``engines``: names of long-lived engine actors to use instead of one engine per
    stage actor. ``g_a``/``g_c`` override the group sizes (evaluation: ``eval.samples`` and 1); ``salt`` is
    added to the iteration's seed (evaluation: :func:`rlcr.seeds.eval_salt`). ``confidences``: run the
    turn-2 confidence stage (default: only where ``cfg.method.name`` trains it, ``rlcr``; evaluation asks
    ``rlvr`` too). ``rlcr_single`` states its confidence in the answer turn and never has a turn 2.
    ``temperature``: both turns' decoding temperature in place of ``rollout.temperature`` (evaluation; 0:
    greedy decoding, the RLCR paper's evaluation protocol).
    """
    if temperature is not None and not 0.0 <= temperature <= 2.0:
        raise ValueError(f"temperature must be in [0, 2] (0: greedy), got {temperature}")
    method = method_record(cfg.method.name)
    if confidences is None:
        confidences = method.trains_confidence_turn
    if confidences and method.single_turn:
        raise ValueError("method rlcr_single states its confidence in the answer turn: it has no turn 2")
    import ray.data

    ctx = ray.data.DataContext.get_current()
    # A stable row order; the samples themselves do not depend on it (each has its own request seed).
    ctx.execution_options.preserve_order = True
    ctx.enable_progress_bars = cfg.rollout.progress
    seed = seeds.rollout_seed(cfg.run.seed, iteration, salt=salt)
    # rollout.pipeline_turns: the answer stage also samples each answer's confidences as soon as it is done
    turn2 = (g_c or cfg.rollout.num_generations_confidence) if confidences and cfg.rollout.pipeline_turns else None
    answer, confidence = _stage_steps(cfg, policy_uri, seed, engines, g_a, g_c, temperature, turn2)
    cheap = dict(batch_format="pandas", num_cpus=STAGE_ACTOR_CPUS)
    task = get_task(cfg.tasks.name)
    items = [{"prompt_id": pid, **task.to_record(t)} for pid, t in tasks]
    ds = ray.data.from_items(items, override_num_blocks=max(1, math.ceil(len(items) / cfg.rollout.batch_size)))
    ds = ds.map_batches(**answer, batch_size=cfg.rollout.batch_size)
    ds = ds.map_batches(score_answers, fn_kwargs={"format_score": cfg.method.format_score, "method": cfg.method.name,
                                                  "lambda_conf": cfg.method.lambda_conf, "task": cfg.tasks.name},
                        **cheap)
    if not confidences:
        return ds
    ds = ds.map_batches(expand_to_turn2, fn_kwargs={"task": cfg.tasks.name}, **cheap)
    # One confidence call takes all answers of one answer call: the engine sees as large a batch as in turn 1.
    conf_batch = cfg.rollout.batch_size * (g_a or cfg.rollout.num_generations_answer)
    ds = ds.map_batches(**confidence, batch_size=conf_batch)
    ds = ds.map_batches(score_confidences, **cheap)
    return ds


def _stage_steps(cfg: RLCRConfig, policy_uri: str, seed: int, engines: list[str] | None, g_a: int | None,
                 g_c: int | None, temperature: float | None = None,
                 turn2: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """``map_batches`` arguments of the answer and the confidence stage (:func:`stage_compute`).

    ``tasks``: the stage functions, with the engines' actor handles (looked up here, once per dataset) in
    ``fn_kwargs``, at most ``rollout.actors`` batches of a stage at a time. ``actors``: the stage classes in a
    pool of ``rollout.actors`` stage actors, which own their engine (on the accelerator, with the node's
    cores) unless ``engines`` are given."""
    import ray.data

    common = dict(cfg=cfg.model_dump(mode="json"), policy_uri=policy_uri, seed=seed, temperature=temperature)
    if stage_compute(engines) == "tasks":
        import ray

        common["engines"] = [ray.get_actor(name) for name in engines]
        opts = dict(compute=ray.data.TaskPoolStrategy(size=cfg.rollout.actors), batch_format="pandas",
                    num_cpus=STAGE_ACTOR_CPUS)
        return (dict(fn=answer_batch, fn_kwargs=dict(common, n=g_a, turn2=turn2), **opts),
                dict(fn=confidence_batch, fn_kwargs=dict(common, n=g_c), **opts))
    common["engines"] = engines
    # A stage actor that owns an engine needs the accelerator; one that talks to a shared engine does not.
    gpus = cfg.engine.tensor_parallel_size if (cfg.update.use_gpu and not engines) else 0
    opts = dict(compute=ray.data.ActorPoolStrategy(size=cfg.rollout.actors), batch_format="pandas", num_gpus=gpus,
                num_cpus=ENGINE_ACTOR_CPUS if not engines else STAGE_ACTOR_CPUS)
    if not engines:  # a stage actor that owns its engine needs the node's cores, not Ray's 1 thread
        from rlcr.rollout.engine import engine_runtime_env

        opts["runtime_env"] = engine_runtime_env()
    return (dict(fn=AnswerStage, fn_constructor_kwargs=dict(common, n=g_a, turn2=turn2), **opts),
            dict(fn=ConfidenceStage, fn_constructor_kwargs=dict(common, n=g_c), **opts))


def _clean(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def to_records(raw_rows: Sequence[dict[str, Any]], run_id: str, iteration: int) -> list[dict[str, Any]]:
    """Pipeline rows → rollout records (sentinels → nulls, numpy → Python, ``_`` timing columns dropped)."""
    out = []
    for raw in raw_rows:
        r = {k: _clean(v) for k, v in raw.items() if k != "turn2_messages" and not k.startswith("_")}
        r["run_id"], r["iteration"] = run_id, iteration
        if r["confidence_id"] is not None and r["confidence_id"] < 0:
            r["confidence_id"] = None
        for key in ("score", "confidence"):
            if r.get(key) is not None and isinstance(r[key], float) and math.isnan(r[key]):
                r[key] = None
        out.append(r)
    return out


def rollout_stats(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Per-sample-type reward mean/std, lengths, format and parse rates; generated and trained (loss-masked)
    tokens of the iteration, the currency in which methods are compared (docs/design.md §9)."""
    stats: dict[str, float] = {
        "tokens/generated": float(sum(len(r["completion_ids"]) for r in rows)),
        "tokens/trained": float(sum(sum(r["loss_mask"]) for r in rows if r.get("loss_mask") is not None)),
    }
    for kind in ("answer", "confidence"):
        sel = [r for r in rows if r["sample_type"] == kind]
        if not sel:
            continue
        rewards = np.array([r["reward"] for r in sel], dtype=float)
        lengths = np.array([len(r["completion_ids"]) for r in sel], dtype=float)
        stats[f"{kind}/reward_mean"] = float(rewards.mean())
        stats[f"{kind}/reward_std"] = float(rewards.std())
        stats[f"{kind}/length_mean"] = float(lengths.mean())
        stats[f"{kind}/truncated_frac"] = float(np.mean([r["truncated"] for r in sel]))
        stats[f"{kind}/count"] = float(len(sel))
        if kind == "answer":
            stats["answer/format_rate"] = float(np.mean([(r.get("score") or 0) > 0 for r in sel]))
            stats["answer/accuracy"] = float(np.mean([r["correct"] for r in sel]))
            timeouts = [r["verifier_timeouts"] for r in sel if r.get("verifier_timeouts") is not None]
            if timeouts:  # answers the verifier scored wrong for lack of time (not kept in the Parquet file)
                stats["verifier/timeouts"] = float(sum(timeouts))
            stated = [r["confidence"] for r in sel if r.get("confidence") is not None]
            if stated:  # rlcr_single: the answer's own confidence
                stats["answer/confidence_mean"] = float(np.mean(stated))
                stats["answer/confidence_parse_rate"] = len(stated) / len(sel)
        else:
            stats["confidence/parse_rate"] = float(np.mean([r.get("confidence") is not None for r in sel]))
            conf = [r["confidence"] for r in sel if r.get("confidence") is not None]
            stats["confidence/mean"] = float(np.mean(conf)) if conf else float("nan")
    return stats


def check_prompt_lengths(cfg: RLCRConfig, tasks: Sequence[tuple[int, Any]], policy_uri: str) -> None:
    """Fail before any Ray work if a prompt can be longer than ``rollout.max_prompt_tokens``: a first-turn prompt
    (``method``'s), or, for the methods with a turn 2, a turn-2 prompt holding the longest answer the engine may
    write (the task's turn 2 with an empty answer + ``rollout.max_answer_tokens``). Otherwise a long answer would
    stop the run hours in, at the turn-2 prompt that holds it."""
    from transformers import AutoTokenizer

    from rlcr.models.adapters import fetch_model
    from rlcr.models.chat import render_prompt

    tokenizer = AutoTokenizer.from_pretrained(fetch_model(policy_uri, endpoint_url=cfg.storage.s3_endpoint_url))
    kind, r = get_task(cfg.tasks.name), cfg.rollout
    two_turn = method_record(cfg.method.name).has_confidence_turn
    messages = kind.turn1_messages if two_turn else kind.single_turn_messages
    for pid, task in tasks:
        render_prompt(tokenizer, messages(task), where=f"prompt_id={pid}", max_prompt_tokens=r.max_prompt_tokens)
        if two_turn:
            empty = len(render_prompt(tokenizer, kind.turn2_messages(task, ""))[1])
            if empty + r.max_answer_tokens > r.max_prompt_tokens:
                raise ValueError(
                    f"prompt_id={pid}: its turn-2 prompt can reach {empty + r.max_answer_tokens} tokens ({empty} with "
                    f"an empty answer + rollout.max_answer_tokens={r.max_answer_tokens}) > rollout.max_prompt_tokens="
                    f"{r.max_prompt_tokens}: raise rollout.max_prompt_tokens (engine.max_model_len must hold it + "
                    "rollout.max_confidence_tokens) or lower rollout.max_answer_tokens")


def generate_rollouts(
    cfg: RLCRConfig,
    tasks: Sequence[tuple[int, Any]],
    *,
    policy_uri: str,
    run_id: str,
    iteration: int,
    engines=None,
    tokenizer_uri: str | None = None,
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Both generation stages and the scoring steps on Ray Data → (scored records, timings).

    ``engines``: an :class:`~rlcr.rollout.engine.EnginePool` holding ``policy_uri``
    (long-lived engines: then ``policy_uri`` is the id of the weights they hold, which need not
    be a checkpoint); None: each stage actor starts its own engine from the checkpoint ``policy_uri``.
    ``tokenizer_uri``: a checkpoint with the policy's tokenizer (default ``policy_uri``).
    """
    check_prompt_lengths(cfg, tasks, tokenizer_uri or policy_uri)
    t0 = time.perf_counter()
    ds = build_rollout_dataset(cfg, tasks, policy_uri, iteration, engines=engines.names if engines else None)
    raw = ds.take_all()
    timings = {"rollout/pipeline_s": time.perf_counter() - t0}
    for k in ("_answer_init_s", "_answer_generate_s", "_confidence_init_s", "_confidence_generate_s"):
        timings[f"rollout/{k.lstrip('_')}"] = float(sum(r.get(k, 0.0) or 0.0 for r in raw))
    rows = to_records(raw, run_id, iteration)
    g_c = method_record(cfg.method.name).training_confidences(cfg.rollout.num_generations_confidence)
    validate_rollouts(rows, num_prompts=len(tasks), g_a=cfg.rollout.num_generations_answer, g_c=g_c)
    return rows, timings


def finalize_rollouts(
    cfg: RLCRConfig, rows: list[dict[str, Any]], *, run_id: str, iteration: int, store=None,
    policy_version: int | None = None,
) -> RolloutResult:
    """Advantages (docs/design.md §7), a stable row order, and the Parquet file (if ``store`` is given).
    ``policy_version``: the updates in the policy that sampled the rows (recorded per row; its staleness, the
    updates it lags behind the policy that trains on them, ``iteration − 1 − policy_version``, in the stats)."""
    t0 = time.perf_counter()
    for r in rows:
        r["policy_version"] = policy_version
    assign_advantages(rows, method=cfg.method.name, eps=cfg.method.adv_eps, scale_by_std=cfg.method.scale_by_std,
                      conf_mode=cfg.method.conf_norm_mode)
    rows.sort(key=lambda r: (r["sample_type"] != "answer", r["prompt_id"], r["answer_id"], r["confidence_id"] or 0))
    uri = None
    if store is not None:
        uri = store.write_parquet(RunLayout.standalone_rollouts_rel(run_id, iteration),
                                  rows_to_table(rows, cfg.tasks.name))
    stats = rollout_stats(rows)
    if policy_version is not None:
        stats["staleness"] = float(iteration - 1 - policy_version)
    return RolloutResult(rows=rows, uri=uri, timings={"rollout/finalize_s": time.perf_counter() - t0}, stats=stats)


def run_rollouts(
    cfg: RLCRConfig,
    tasks: Sequence[tuple[int, Any]],
    *,
    policy_uri: str,
    run_id: str,
    iteration: int,
    store=None,
    engines=None,
) -> RolloutResult:
    """Generate, score and normalise one iteration's rollouts; write them as Parquet if ``store`` is given."""
    rows, timings = generate_rollouts(cfg, tasks, policy_uri=policy_uri, run_id=run_id, iteration=iteration,
                                      engines=engines)
    result = finalize_rollouts(cfg, rows, run_id=run_id, iteration=iteration, store=store)
    result.timings = {**timings, **result.timings}
    return result
