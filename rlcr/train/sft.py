"""Format warm-start: supervised fine-tuning on the task's worked traces (the RLCR paper's SFT+RLCR cold start).

Out of the box SmolLM2-135M-Instruct writes the ``<answer>`` format 0% of the time on Countdown
(docs/design.md §17), so RL alone has no signal. The run's task (``cfg.tasks.name``) writes supervised examples for
both turns (:meth:`rlcr.tasks.base.Task.warm_start_examples`) on training problems
(:func:`rlcr.runs.task_sets.sft_tasks`), and this module trains on them with the same Ray Train update machinery
(objective ``sft``: token-mean NLL over the completion):

* ``countdown`` (:mod:`rlcr.tasks.countdown_sft`): turn 1 a ``<think>`` trace of attempts, each a few exact
  steps and its value against the target, then the solver's solution; turn 2 an exact ``<analysis>`` check
  and a ``<confidence>`` that leans its way, half of them after a *wrong* answer (context only, no loss);
* ``math``: turn 1 the dataset's worked solution (GSM8K's rationale, MATH's solution) and the final answer;
  turn 2 **format only**: a bare ``<confidence>`` after that right answer, its value spread (0.5–0.9), since
  there is no programmatic check of a free-text solution to write and no wrong answers are shown: the SFT's
  Brier target there teaches where the confidence goes, not what it should be; RL calibrates it.

With ``sft.single_turn`` each task also gets a one-turn example in the ``rlcr_single`` format (docs/design.md §9).
One warm-start then serves every method.
"""

from __future__ import annotations

from typing import Any

from rlcr.runs.task_sets import sft_tasks
from rlcr.seeds import sft_seed
from rlcr.tasks.registry import get_task

__all__ = ["task_examples", "sft_rows", "sft_update_config", "warm_start", "run_sft", "check_warm_start",
           "NoWarmStart"]


class NoWarmStart(ValueError):
    """The run's task writes no warm-start traces."""


def check_warm_start(cfg) -> None:
    """Refuse, in one line naming the method, a task that defines neither ``warm_start`` nor
    ``warm_start_examples``: it has no worked traces, so ``rlcr sft`` has nothing to train on (before any work)."""
    from rlcr.tasks.base import Task

    task = get_task(cfg.tasks.name)
    kind = type(task)
    if kind.warm_start is Task.warm_start and kind.warm_start_examples is Task.warm_start_examples:
        raise NoWarmStart(f"task {task.name!r} defines no warm_start(problem, rng), so it has no worked traces for "
                          f"the SFT warm-start (docs/tasks.md, 'warm_start'): add one, or train without a warm-start")


def task_examples(cfg, n_tasks: int, seed: int) -> list[dict[str, Any]]:
    """The warm-start's chat examples ``{"messages", "completion", "sample_type", "task", "loss_from"}`` of
    ``n_tasks`` problems of the run's training pool (:func:`rlcr.runs.task_sets.sft_tasks`): two per problem (turn 1,
    turn 2), then, with ``cfg.sft.single_turn``, one more per problem in the one-turn format. ``loss_from``: the
    character of ``completion`` where the loss starts (0: all of it)."""
    check_warm_start(cfg)
    return get_task(cfg.tasks.name).warm_start_examples(sft_tasks(cfg, n_tasks), seed, single_turn=cfg.sft.single_turn)


def sft_rows(cfg, tokenizer, n_tasks: int | None = None, seed: int | None = None) -> list[dict[str, Any]]:
    """The examples as update rows (``rollout_schema`` fields the trainer reads): the whole target
    completion (and its end-of-turn token) carries loss, advantage 1.

    ``n_tasks``: default ``cfg.sft.tasks``; ``seed`` (wrong answers, stated confidences): default
    :func:`rlcr.seeds.sft_seed` of ``cfg.run.seed``, what :func:`run_sft` trains on."""
    from rlcr.models.chat import render_prompt
    from rlcr.rollout.records import rollout_row

    n_tasks = cfg.sft.tasks if n_tasks is None else n_tasks
    seed = sft_seed(cfg.run.seed) if seed is None else seed
    rows = []
    # the run's training tasks (never a held-out one); ``seed`` drives the wrong answers and confidences
    examples = task_examples(cfg, n_tasks, seed)
    for i, ex in enumerate(examples):
        context, ctx_ids = render_prompt(tokenizer, ex["messages"])
        cut = ex["loss_from"]
        shown = tokenizer(ex["completion"][:cut], add_special_tokens=False)["input_ids"] if cut else []
        learned = tokenizer(ex["completion"][cut:], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        # prompt ids: a task's two-turn pair shares one; its one-turn example (a different prompt) has its own
        pid = i // 2 if i < 2 * n_tasks else i - n_tasks
        rows.append(rollout_row(
            ex["sample_type"], task=ex["task"], task_name=cfg.tasks.name, run_id="sft", iteration=0, prompt_id=pid,
            answer_id=0,
            confidence_id=0 if ex["sample_type"] == "confidence" else None, context_text=context, context_ids=ctx_ids,
            completion_text=ex["completion"], completion_ids=shown + learned,
            loss_mask=[0] * len(shown) + [1] * len(learned), correct=1.0, reward=1.0, advantage=1.0,
        ))
    return rows


def sft_update_config(cfg, n_rows: int, *, storage_uri: str | None = None):
    """The config of the warm-start's one update of ``n_rows`` rows: objective ``sft`` with the ``sft_*``
    settings of ``cfg`` in place of the RL ones (its LR schedule spans this update's own steps), no
    reference model; the other update settings (AdamW betas, weight decay, grad_clip, micro-batches,
    workers) are the run's."""
    return cfg.model_copy(update={
        "update.objective": "sft", "update.learning_rate": cfg.sft.learning_rate,
        "update.epochs_per_iteration": cfg.sft.epochs,
        "update.mini_batches_per_epoch": max(1, n_rows // cfg.sft.batch_size),
        "update.lr_schedule": cfg.sft.lr_schedule,
        "update.warmup_steps": cfg.sft.warmup_steps, "loss.kl_coef": 0.0, "run.iterations": 1,
        "storage.uri": storage_uri or cfg.storage.uri,
    })


def run_sft(cfg, *, out: str | None = None, run_id: str | None = None) -> tuple[str, dict[str, Any]]:
    """Warm-start ``cfg.model.name`` on the task's traces with the Ray Train update; returns (checkpoint URI, metrics).

    ``cfg.sft.tasks`` tasks of the training pool, ``cfg.sft.epochs`` passes, and the other ``sft_*``
    settings (:func:`sft_update_config`). The checkpoint goes to ``<out or storage>/runs/<run_id>/iter-0000/checkpoint``
    (``run_id`` default ``sft-<seed>``), sealed like every checkpoint; pass it to ``train`` as ``model=<uri>``.
    """
    from transformers import AutoTokenizer

    from rlcr.models.adapters import fetch_model
    from rlcr.models.source import import_model
    from rlcr.runs.cluster import ensure_ray
    from rlcr.storage import Store
    from rlcr.train.trainer import run_update

    store = Store(out or cfg.storage.uri, endpoint_url=cfg.storage.s3_endpoint_url)
    base = import_model(cfg.model.name, store, chat_template=cfg.model.chat_template)
    tokenizer = AutoTokenizer.from_pretrained(fetch_model(base, endpoint_url=cfg.storage.s3_endpoint_url))
    rows = sft_rows(cfg, tokenizer)
    sft_cfg = sft_update_config(cfg, len(rows), storage_uri=out)
    ensure_ray(cfg)
    result = run_update(sft_cfg, rows, policy_uri=base, run_id=run_id or f"sft-{cfg.run.seed}", iteration=0)
    return result.checkpoint_uri, result.metrics


def warm_start(cfg, *, run_id: str) -> tuple[str, bool]:
    """The warm-start checkpoint of run ``run_id``: reused if it is already sealed in the store (a re-run of
    the demo or the learning benchmark), else trained with :func:`run_sft` (``cfg``'s ``sft_*`` settings).
    Returns (URI, reused)."""
    from rlcr.runs.store import RunStore

    run = RunStore.open(cfg, run_id)
    rel = run.checkpoint_rel(0)
    if run.store.is_complete(rel):
        return run.store.url(rel), True
    return run_sft(cfg, run_id=run_id)[0], False
