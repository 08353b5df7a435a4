"""The two generation stages and the steps between them, as Ray Data batch functions (docs/design.md §1, §9).

    prompts ─ AnswerStage ─ score_answers ─ expand_to_turn2 ─ ConfidenceStage ─ score_confidences

``method: rlvr`` trains on the first two steps only (evaluation adds turn 2). ``method: rlcr_single`` has
one stage: ``AnswerStage`` with the one-turn prompt, whose responses hold the answer and the confidence,
then ``score_answers`` (which parses that confidence and adds its Brier term to the reward).

With shared engine actors (:class:`~rlcr.rollout.engine.RolloutEngine`, the flow's case) the stages are
the plain functions :func:`answer_batch` and :func:`confidence_batch` for a task-based
``Dataset.map_batches(fn, fn_kwargs=…)``: ``fn_kwargs`` carry the engines' actor handles, a batch goes to
the engine its first prompt id picks (a confidence batch to the engine of its answers), and what a stage
needs besides (the validated config) is kept per worker process. Ray reuses its worker processes, so a
dataset starts nothing: the per-dataset start of stage actors cost seconds per iteration
(docs/iteration-overhead.md). ``AnswerStage`` and ``ConfidenceStage`` are the same stages as callable
classes for ``Dataset.map_batches(Cls, compute=ActorPoolStrategy(size=n), …)``: each actor fetches the
policy checkpoint once (local path or ``s3://``) and owns a ``vllm.LLM`` (no shared engines), or sends its
batches to a shared engine actor (``RLCR_ROLLOUT_STAGES=actors``, the former way, kept for comparison:
:mod:`rlcr.rollout.pipeline`). Batches are pandas DataFrames. ``ConfidenceStage`` passes its input
answer rows through and appends the G_c confidence rows of each answer, so the
stage's output is the whole rollout tree.

In-pipeline sentinels (Arrow needs one type per column across batches):
``confidence_id = -1`` on answer rows, ``confidence``/``score`` = NaN where not
applicable; :func:`rlcr.rollout.pipeline.to_records` turns them into nulls.
"""

from __future__ import annotations

import functools
import json
import math
import time
from typing import Any

import pandas as pd

from rlcr.config import RLCRConfig
from rlcr.core.methods import method_record
from rlcr.rollout.records import answer_scores, confidence_scores, rollout_row
from rlcr.seeds import answer_seed, confidence_seed
from rlcr.tasks.registry import get_task

__all__ = [
    "AnswerStage",
    "ConfidenceStage",
    "answer_batch",
    "confidence_batch",
    "score_answers",
    "expand_to_turn2",
    "score_confidences",
    "ANSWER_STOP",
    "CONFIDENCE_STOP",
]

# Generation ends at the closing tag of the turn (kept in the text): nothing after it is scored.
ANSWER_STOP = ("</answer>",)
CONFIDENCE_STOP = ("</confidence>",)


def _task(row, task: str):
    """The problem of a pipeline row of the task ``task`` (its task columns:
    :meth:`~rlcr.tasks.base.Task.from_record`)."""
    return get_task(task).from_record(row)


@functools.lru_cache(maxsize=8)
def _validated(cfg_json: str) -> RLCRConfig:
    """The config of a stage, validated once per worker process (a task-based stage builds its stage per batch)."""
    return RLCRConfig.model_validate(json.loads(cfg_json))


class _EngineStage:
    """Shared part of both stages: config, tokenizer, and the engine.

    Without ``engines`` the stage owns its ``vllm.LLM`` (created in the actor from
    ``policy_uri``). With ``engines`` (names of :class:`~rlcr.rollout.engine.RolloutEngine`
    actors, or their actor handles) it sends its requests to one of those long-lived engines instead
    (a stage actor picks one by its actor id; :func:`answer_batch` passes the one it picked).
    ``n`` overrides the number of samples per input (evaluation uses 1); ``temperature`` overrides
    ``rollout.temperature`` (evaluation only; 0 decodes greedily, vLLM's ``temperature < 1e-5``).
    ``turn2`` (answer stage, ``rollout.pipeline_turns``): also sample this many confidences per answer in the
    same engine run, each answer's as soon as it is done (:func:`~rlcr.rollout.sampling.sample_tree`); they ride
    along in the ``_turn2`` column to the confidence stage, which then lays them out instead of sampling.
    """

    stage_name = "stage"
    mask_kind = "answer"

    def __init__(self, cfg: dict[str, Any], policy_uri: str, seed: int,
                 engines: list | None = None, n: int | None = None, temperature: float | None = None,
                 turn2: int | None = None):
        t0 = time.perf_counter()
        self.cfg = _validated(json.dumps(cfg, sort_keys=True))
        self.policy_uri, self.seed, self.n, self.turn2 = policy_uri, seed, n, turn2
        self.temperature = self.cfg.rollout.temperature if temperature is None else float(temperature)
        self.llm = self.tokenizer = self.engine = None
        if engines:
            import ray

            index = int(ray.get_runtime_context().get_actor_id()[-8:], 16) % len(engines) if len(engines) > 1 else 0
            self.engine = ray.get_actor(engines[index]) if isinstance(engines[index], str) else engines[index]
        else:
            from transformers import AutoTokenizer

            from rlcr.models.adapters import fetch_model
            from rlcr.rollout.engine import create_engine

            local = fetch_model(policy_uri, endpoint_url=self.cfg.storage.s3_endpoint_url)
            self.tokenizer = AutoTokenizer.from_pretrained(local)
            self.llm = create_engine(local, self.cfg, seed=seed)
        self.init_s = time.perf_counter() - t0
        self.batches = 0

    def _generate(self, conversations, labels: list[str], max_tokens: int, stop, n: int, seeds: list[list[int]]):
        """Render, sample and mask one batch where the engine is; returns (contexts, samples).

        ``seeds``: per conversation, the request seed of each of its ``n`` samples (:mod:`rlcr.seeds`): a sample
        depends on its own seed, not on how Ray Data bundled the rows into batches."""
        from rlcr.rollout.sampling import sample_chats

        kwargs = dict(labels=labels, mask_kind=self.mask_kind, seeds=seeds, n=n,
                      temperature=self.temperature, top_p=self.cfg.rollout.top_p, max_tokens=max_tokens, stop=stop)
        t0 = time.perf_counter()
        if self.engine is not None:
            from rlcr.rollout.engine import engine_get

            out = engine_get(self.engine.generate_chats.remote(conversations, policy_uri=self.policy_uri, **kwargs),
                             self.cfg, "generate_chats")
        else:
            out = sample_chats(self.llm, self.tokenizer, conversations,
                               max_prompt_tokens=self.cfg.rollout.max_prompt_tokens, **kwargs)
        self.last_generate_s = time.perf_counter() - t0
        return out

    def _generate_tree(self, conversations, labels: list[str], tasks: list, prompt_ids: list[int], g: int, g_c: int):
        """Both turns of one batch in one engine run (``turn2``): (contexts, samples, turn-2 tree), as
        :meth:`rlcr.rollout.engine.RolloutEngine.generate_tree`; the seeds are those of the two stages."""
        from rlcr.rollout.sampling import sample_tree

        seeds = [[answer_seed(self.seed, pid, k) for k in range(g)] for pid in prompt_ids]
        conf_seeds = [[[confidence_seed(self.seed, pid, k, h) for h in range(g_c)] for k in range(g)]
                      for pid in prompt_ids]
        rollout = self.cfg.rollout
        kwargs = dict(labels=labels, seeds=seeds, temperature=self.temperature, top_p=rollout.top_p,
                      max_tokens=(rollout.max_answer_tokens, rollout.max_confidence_tokens),
                      stop=(ANSWER_STOP, CONFIDENCE_STOP))
        t0 = time.perf_counter()
        if self.engine is not None:
            from rlcr.rollout.engine import engine_get

            ref = self.engine.generate_tree.remote(conversations, policy_uri=self.policy_uri, tasks=tasks,
                                                   prompt_ids=prompt_ids, confidence_seeds=conf_seeds, **kwargs)
            out = engine_get(ref, self.cfg, "generate_tree")
        else:
            task = get_task(self.cfg.tasks.name)

            def turn2(i, k, s):
                return (task.turn2_messages(tasks[i], s.completion_text), f"prompt_id={prompt_ids[i]} answer_id={k}",
                        conf_seeds[i][k])

            out = sample_tree(self.llm, self.tokenizer, conversations, turn2=turn2,
                              max_prompt_tokens=rollout.max_prompt_tokens, **kwargs)
        self.last_generate_s = time.perf_counter() - t0
        return out

    def _timing(self, df: pd.DataFrame) -> pd.DataFrame:
        """Per-batch timing columns (``_``-prefixed; dropped from the records, summed into the timings)."""
        first = self.batches == 0
        self.batches += 1
        df[f"_{self.stage_name}_init_s"] = [self.init_s if first and i == 0 else 0.0 for i in range(len(df))]
        df[f"_{self.stage_name}_generate_s"] = [self.last_generate_s if i == 0 else 0.0 for i in range(len(df))]
        return df

    def _row(self, sample_type: str, task, context: tuple[str, list[int]], s, **fields) -> dict[str, Any]:
        """The :func:`~rlcr.rollout.records.rollout_row` of engine sample ``s`` drawn from ``context``."""
        text, ids = context
        return rollout_row(sample_type, task=task, task_name=self.cfg.tasks.name, context_text=text, context_ids=ids,
                           completion_text=s.completion_text, completion_ids=s.completion_ids,
                           completion_logprobs=s.completion_logprobs, loss_mask=s.loss_mask,
                           finish_reason=s.finish_reason, **fields)


class AnswerStage(_EngineStage):
    """Turn 1: G_a answers per prompt. Input columns: prompt_id and the task's record (Countdown: nums, target).

    With ``method: rlcr_single`` the one-turn prompt: each response states its confidence after the answer
    (stops at ``</confidence>``; ``max_answer_tokens + max_confidence_tokens`` tokens; the ``single`` mask)."""

    stage_name = "answer"

    @property
    def mask_kind(self) -> str:
        return "single" if method_record(self.cfg.method.name).single_turn else "answer"

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        single = method_record(self.cfg.method.name).single_turn
        g = self.n or self.cfg.rollout.num_generations_answer
        task = get_task(self.cfg.tasks.name)
        messages = task.single_turn_messages if single else task.turn1_messages
        problems = [_task(r, task.name) for _, r in batch.iterrows()]
        prompt_ids = [int(r["prompt_id"]) for _, r in batch.iterrows()]
        conversations = [messages(t) for t in problems]
        labels = [f"prompt_id={pid}" for pid in prompt_ids]
        if self.turn2 and not single:
            contexts, samples, tree = self._generate_tree(conversations, labels, problems, prompt_ids, g, self.turn2)
        else:
            contexts, samples = self._generate(
                conversations, labels,
                self.cfg.rollout.max_answer_tokens + (self.cfg.rollout.max_confidence_tokens if single else 0),
                CONFIDENCE_STOP if single else ANSWER_STOP, g,
                [[answer_seed(self.seed, pid, k) for k in range(g)] for pid in prompt_ids])
            tree = None
        rows = [self._row("answer", t, context, s, prompt_id=pid, answer_id=k, confidence_id=-1)
                for t, pid, context, group in zip(problems, prompt_ids, contexts, samples) for k, s in enumerate(group)]
        if tree is not None:  # each answer row carries its own turn 2, in answer order
            carried = [_carry(*tree[i][k]) for i in range(len(problems)) for k in range(g)]
            for row, turn2 in zip(rows, carried):
                row["_turn2"] = turn2
        return self._timing(pd.DataFrame(rows))


def _carry(conversation, context: tuple[str, list[int]], samples) -> str:
    """An answer's pipelined turn 2 as one JSON string (a column Arrow keeps as is): its conversation (the one
    :func:`expand_to_turn2` builds, compared there), its rendered context and its samples."""
    text, ids = context
    return json.dumps({"messages": json.dumps(conversation), "context_text": text, "context_ids": list(ids),
                       "samples": [{"ids": s.completion_ids, "text": s.completion_text,
                                    "logprobs": s.completion_logprobs, "finish_reason": s.finish_reason,
                                    "loss_mask": s.loss_mask} for s in samples]})


def score_answers(batch: pd.DataFrame, format_score: float, method: str = "rlcr", lambda_conf: float = 1.0, *,
                  task: str) -> pd.DataFrame:
    """``correct`` ∈ {0, 1} from the verifier of the task ``task`` and ``method``'s reward (docs/design.md §5, §9:
    :func:`~rlcr.rollout.records.answer_scores`); keeps the raw score, and the stated confidence of a
    one-turn response (NaN otherwise), and ``verifier_timeouts``: the answers the task's verifier scored wrong
    for lack of time while scoring the row (the batch is one :meth:`~rlcr.tasks.base.Task.scoring` batch)."""
    batch = batch.copy()
    scores, timeouts = [], []
    with get_task(task).scoring(len(batch)) as stats:
        for _, r in batch.iterrows():
            before = stats.timeouts
            scores.append(answer_scores(r["completion_text"], _task(r, task), format_score=format_score,
                                        method=method, lambda_conf=lambda_conf, task_name=task))
            timeouts.append(stats.timeouts - before)
    batch["verifier_timeouts"] = timeouts
    batch["score"] = [s["score"] for s in scores]
    batch["correct"] = [s["correct"] for s in scores]
    batch["reward"] = [s["reward"] for s in scores]
    batch["confidence"] = [math.nan if s["confidence"] is None else s["confidence"] for s in scores]
    return batch


def expand_to_turn2(batch: pd.DataFrame, task: str) -> pd.DataFrame:
    """Attach each answer's turn-2 conversation (of the task ``task``): turn 1 + that exact answer + the
    confidence query."""
    batch = batch.copy()
    kind = get_task(task)
    batch["turn2_messages"] = [
        json.dumps(kind.turn2_messages(_task(r, task), r["completion_text"])) for _, r in batch.iterrows()
    ]
    return batch


class ConfidenceStage(_EngineStage):
    """Turn 2: G_c confidences per answer, each conditioned on that exact answer.

    Input: scored answer rows with ``turn2_messages``. Output: those answer rows
    followed by their confidence rows.
    """

    stage_name = "confidence"
    mask_kind = "confidence"

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        g = self.n or self.cfg.rollout.num_generations_confidence
        if "_turn2" in batch.columns:  # sampled with the answers (rollout.pipeline_turns): lay them out
            contexts, samples = _carried(batch, g)
            self.last_generate_s = 0.0
        else:
            contexts, samples = self._generate(
                [json.loads(r["turn2_messages"]) for _, r in batch.iterrows()],
                [f"prompt_id={r['prompt_id']} answer_id={r['answer_id']}" for _, r in batch.iterrows()],
                self.cfg.rollout.max_confidence_tokens, CONFIDENCE_STOP, g,
                [[confidence_seed(self.seed, int(r["prompt_id"]), int(r["answer_id"]), h) for h in range(g)]
                 for _, r in batch.iterrows()])
        answers = batch.drop(columns=[c for c in ("turn2_messages", "_turn2") if c in batch.columns])
        rows = [self._row("confidence", _task(r, self.cfg.tasks.name), context, s, prompt_id=r["prompt_id"],
                          answer_id=r["answer_id"], confidence_id=h, score=math.nan, correct=float(r["correct"]),
                          reward=0.0, confidence=math.nan)
                for (_, r), context, group in zip(answers.iterrows(), contexts, samples) for h, s in enumerate(group)]
        conf = self._timing(pd.DataFrame(rows))
        return pd.concat([_listify(answers, self.cfg.tasks.name), conf], ignore_index=True).fillna(
            {c: 0.0 for c in ("_answer_init_s", "_answer_generate_s", "_confidence_init_s", "_confidence_generate_s")}
        )


def _carried(batch: pd.DataFrame, g: int):
    """(contexts, samples) of the turn 2 the answer stage sampled with each answer (``_turn2``), checked: its
    conversation is the one :func:`expand_to_turn2` built for that answer, with ``g`` samples."""
    from rlcr.rollout.sampling import Sample

    contexts, samples = [], []
    for _, r in batch.iterrows():
        where = f"prompt_id={r['prompt_id']} answer_id={r['answer_id']}"
        carried = json.loads(r["_turn2"])
        if carried["messages"] != r["turn2_messages"] or len(carried["samples"]) != g:
            raise RuntimeError(f"{where}: the turn 2 sampled with the answer is not this answer's "
                               f"({len(carried['samples'])} samples for {g}, or another conversation)")
        contexts.append((carried["context_text"], carried["context_ids"]))
        samples.append([Sample(s["ids"], s["text"], s["logprobs"], s["finish_reason"], s["loss_mask"])
                        for s in carried["samples"]])
    return contexts, samples


def _on_shared_engine(cls, batch: pd.DataFrame, cfg: dict[str, Any], policy_uri: str, seed: int,
                      engines: list, n: int | None, temperature: float | None = None,
                      turn2: int | None = None) -> pd.DataFrame:
    """One batch of stage ``cls`` in a Ray task, on the engine (actor handle) its first prompt id picks."""
    engine = engines[int(batch["prompt_id"].iloc[0]) % len(engines) if len(batch) else 0]
    return cls(cfg, policy_uri, seed, engines=[engine], n=n, temperature=temperature, turn2=turn2)(batch)


def answer_batch(batch: pd.DataFrame, *, cfg: dict[str, Any], policy_uri: str, seed: int, engines: list,
                 n: int | None = None, temperature: float | None = None, turn2: int | None = None) -> pd.DataFrame:
    """:class:`AnswerStage` as a function for a task-based ``map_batches`` (``fn_kwargs``: its constructor's
    arguments, ``engines`` as actor handles). Its ``_answer_init_s`` is each batch's stage set-up here."""
    return _on_shared_engine(AnswerStage, batch, cfg, policy_uri, seed, engines, n, temperature, turn2)


def confidence_batch(batch: pd.DataFrame, *, cfg: dict[str, Any], policy_uri: str, seed: int, engines: list,
                     n: int | None = None, temperature: float | None = None) -> pd.DataFrame:
    """:class:`ConfidenceStage` as a function for a task-based ``map_batches`` (as :func:`answer_batch`)."""
    return _on_shared_engine(ConfidenceStage, batch, cfg, policy_uri, seed, engines, n, temperature)


_LIST_COLUMNS = ("context_ids", "completion_ids", "completion_logprobs", "loss_mask")
"""The generic list columns of a rollout row (a task's own are those of its record fields)."""


def _listify(df: pd.DataFrame, task: str) -> pd.DataFrame:
    """numpy arrays inside list columns (as Ray hands them over) → Python lists: the generic ones and the list
    columns of the task ``task``'s record (:meth:`~rlcr.tasks.base.Task.record_fields`; Countdown's ``nums``)."""
    import pyarrow as pa

    own = [f.name for f in get_task(task).record_fields()
           if pa.types.is_list(f.type) or pa.types.is_large_list(f.type)]
    df = df.copy()
    for col in (*own, *_LIST_COLUMNS):
        if col in df:
            df[col] = [list(x) if x is not None else None for x in df[col]]
    return df


def score_confidences(batch: pd.DataFrame) -> pd.DataFrame:
    """conf_reward = 1 − (acc − c)², 0 if unparseable (docs/design.md §5); answer rows pass through."""
    batch = batch.copy()
    is_conf = batch["sample_type"] == "confidence"
    scores = [confidence_scores(t, int(y))
              for t, y in zip(batch.loc[is_conf, "completion_text"], batch.loc[is_conf, "correct"])]
    batch.loc[is_conf, "confidence"] = [math.nan if s["confidence"] is None else s["confidence"] for s in scores]
    batch.loc[is_conf, "reward"] = [s["reward"] for s in scores]
    return batch
