"""Format warm-start: supervised fine-tuning on solver traces (the RLCR paper's SFT+RLCR cold start).

Out of the box SmolLM2-135M-Instruct writes the ``<answer>`` format 0% of the
time on Countdown (SPEC §10), so RL alone has no signal. This module writes
supervised examples for both turns from the exact solver and trains on them with
the same Ray Train update machinery (objective ``sft``: token-mean NLL over the
completion):

* turn 1 — a step-by-step ``<think>`` trace of a solver solution and the equation;
* turn 2 — after an answer, an ``<analysis>`` that re-checks it and a
  ``<confidence>``. Half of the turn-2 examples are conditioned on a *wrong*
  answer (a perturbed trace, present only as context: its tokens carry no loss,
  so the model never learns to produce it) and state a low confidence; correct
  ones state a high one. The stated values are spread (not all 0.9 / 0.1) so the
  G_c confidences of an answer differ and RL's confidence advantages have signal.

With ``sft_single_turn`` each task also gets a one-turn example in the ``rlcr_single`` format (SPEC §11):
the trace and equation, then the check and confidence in the same response. Half show a wrong answer; for
those only the check and the confidence carry loss, as in turn 2. One warm-start then serves every method.
"""

from __future__ import annotations

import random
from fractions import Fraction
from typing import Any

from rlcr.rewards import accuracy_reward
from rlcr.seeds import sft_seed
from rlcr.tasks.countdown import (
    CountdownTask,
    _parse,
    _tokenize,
    evaluate_expression,
    extract_solution,
    generate_tasks,
    single_turn_messages,
    turn1_messages,
    turn2_messages,
)
from rlcr.tasks.sets import sft_tasks

__all__ = ["solution_steps", "answer_trace", "confidence_trace", "sft_examples", "sft_rows", "sft_update_config",
           "warm_start", "run_sft"]


def _fmt(v: Fraction) -> str:
    return str(v.numerator) if v.denominator == 1 else f"{v.numerator}/{v.denominator}"


def solution_steps(expression: str) -> list[str]:
    """The binary operations of ``expression`` in evaluation order, as ``a op b = c`` strings."""
    postfix, _ = _parse(_tokenize(expression))
    stack: list[Fraction] = []
    steps = []
    for tok in postfix:
        if isinstance(tok, int):
            stack.append(Fraction(tok))
            continue
        b, a = stack.pop(), stack.pop()
        c = a + b if tok == "+" else a - b if tok == "-" else a * b if tok == "*" else a / b
        steps.append(f"{_fmt(a)} {tok} {_fmt(b)} = {_fmt(c)}")
        stack.append(c)
    return steps


def answer_trace(task: CountdownTask, expression: str) -> str:
    """Turn-1 target: reasoning over the solution's steps, then the equation."""
    steps = solution_steps(expression)
    body = " ".join(f"{s}." for s in steps)
    return (f"<think>I need {task.target} from {list(task.nums)}. {body} "
            f"That uses each number once.</think>\n<answer>{expression}</answer>")


def _wrong_expression(task: CountdownTask, rng: random.Random) -> str | None:
    """A plausible wrong answer: the solution with one operator changed (same numbers, other value)."""
    expr = task.solution
    ops = [i for i, ch in enumerate(expr) if ch in "+-*/"]
    rng.shuffle(ops)
    for i in ops:
        for new in rng.sample("+-*/", 4):
            cand = expr[:i] + new + expr[i + 1:]
            shown = f"<answer>{cand}</answer>"
            if (new != expr[i] and evaluate_expression(cand) is not None
                    and extract_solution(shown) is not None and accuracy_reward(shown, task) == 0.0):
                return cand
    return None


def confidence_trace(task: CountdownTask, expression: str, correct: bool, rng: random.Random) -> str:
    """Turn-2 target: re-check the answer's value, then a confidence that leans the right way."""
    try:
        steps = solution_steps(expression)
        value = steps[-1].rsplit("= ", 1)[1] if steps else "?"
    except Exception:
        value = "?"
    verdict = "matches" if correct else "does not match"
    c = rng.choice([0.6, 0.7, 0.8, 0.9, 0.95]) if correct else rng.choice([0.05, 0.1, 0.2, 0.3, 0.4])
    return (f"<analysis>The equation gives {value}, which {verdict} the target {task.target}.</analysis>\n"
            f"<confidence>{c}</confidence>")


def sft_examples(n_tasks: int, seed: int, *, tasks: list[CountdownTask] | None = None, single_turn: bool = False,
                 **task_kwargs) -> list[dict[str, Any]]:
    """Chat examples ``{"messages": [...], "completion": str, "sample_type": ..., "loss_from": int}``: two per
    task (turn 1, turn 2), then, with ``single_turn``, one more per task in the one-turn format.
    ``loss_from``: the character of ``completion`` where the loss starts (0: all of it).

    On ``tasks`` (each with a correct ``solution``; a run passes :func:`rlcr.tasks.sets.sft_tasks`, drawn from
    its training pool) or, without them, on ``n_tasks`` tasks generated from ``seed``."""
    rng = random.Random(seed)
    tasks = generate_tasks(n_tasks, seed, **task_kwargs) if tasks is None else tasks
    out = []
    for task in tasks:
        answer = answer_trace(task, task.solution)
        out.append({"messages": turn1_messages(task), "completion": answer, "sample_type": "answer", "task": task,
                    "loss_from": 0})
        wrong = _wrong_expression(task, rng) if rng.random() < 0.5 else None
        shown, correct = (answer_trace(task, wrong), False) if wrong else (answer, True)
        out.append({"messages": turn2_messages(task, shown), "sample_type": "confidence", "task": task,
                    "completion": confidence_trace(task, wrong or task.solution, correct, rng), "loss_from": 0})
    if single_turn:  # its own random stream: the two-turn examples are the same with or without it
        rng = random.Random(f"single-turn-{seed}")
        for task in tasks:
            wrong = _wrong_expression(task, rng) if rng.random() < 0.5 else None
            shown = answer_trace(task, wrong or task.solution) + "\n"
            check = confidence_trace(task, wrong or task.solution, wrong is None, rng)
            out.append({"messages": single_turn_messages(task), "completion": shown + check, "sample_type": "answer",
                        "task": task, "loss_from": len(shown) if wrong else 0})
    return out


def sft_rows(cfg, tokenizer, n_tasks: int | None = None, seed: int | None = None) -> list[dict[str, Any]]:
    """The examples as update rows (ROLLOUT_SCHEMA fields the trainer reads): the whole target
    completion (and its end-of-turn token) carries loss, advantage 1.

    ``n_tasks``: default ``cfg.sft_tasks``; ``seed`` (wrong answers, stated confidences): default
    :func:`rlcr.seeds.sft_seed` of ``cfg.seed``, what :func:`run_sft` trains on."""
    from rlcr.rollout.engine import render_prompt
    from rlcr.rollout.records import rollout_row

    n_tasks = cfg.sft_tasks if n_tasks is None else n_tasks
    seed = sft_seed(cfg.seed) if seed is None else seed
    rows = []
    # the run's training tasks (never a held-out one); ``seed`` drives the wrong answers and confidences
    examples = sft_examples(n_tasks, seed, tasks=sft_tasks(cfg, n_tasks), single_turn=cfg.sft_single_turn)
    for i, ex in enumerate(examples):
        context, ctx_ids = render_prompt(tokenizer, ex["messages"])
        cut = ex["loss_from"]
        shown = tokenizer(ex["completion"][:cut], add_special_tokens=False)["input_ids"] if cut else []
        learned = tokenizer(ex["completion"][cut:], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        # prompt ids: a task's two-turn pair shares one; its one-turn example (a different prompt) has its own
        pid = i // 2 if i < 2 * n_tasks else i - n_tasks
        rows.append(rollout_row(
            ex["sample_type"], task=ex["task"], run_id="sft", iteration=0, prompt_id=pid, answer_id=0,
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
        "objective": "sft", "learning_rate": cfg.sft_learning_rate, "epochs_per_iteration": cfg.sft_epochs,
        "mini_batches_per_epoch": max(1, n_rows // cfg.sft_batch_size), "lr_schedule": cfg.sft_lr_schedule,
        "warmup_steps": cfg.sft_warmup_steps, "kl_coef": 0.0, "iterations": 1,
        "storage_uri": storage_uri or cfg.storage_uri,
    })


def run_sft(cfg, *, out: str | None = None, run_id: str | None = None) -> tuple[str, dict[str, Any]]:
    """Warm-start ``cfg.model`` on solver traces with the Ray Train update; returns (checkpoint URI, metrics).

    ``cfg.sft_tasks`` tasks of the training pool, ``cfg.sft_epochs`` passes, and the other ``sft_*``
    settings (:func:`sft_update_config`). The checkpoint goes to ``<out or storage>/runs/<run_id>/iter-0000/checkpoint``
    (``run_id`` default ``sft-<seed>``), sealed like every checkpoint; pass it to ``train`` as ``model=<uri>``.
    """
    from transformers import AutoTokenizer

    from rlcr.cluster import ensure_ray
    from rlcr.models import resolve_model
    from rlcr.storage import fetch_checkpoint
    from rlcr.train import run_update

    base = resolve_model(cfg.model)
    tokenizer = AutoTokenizer.from_pretrained(fetch_checkpoint(base, endpoint_url=cfg.s3_endpoint_url))
    rows = sft_rows(cfg, tokenizer)
    sft_cfg = sft_update_config(cfg, len(rows), storage_uri=out)
    ensure_ray()
    result = run_update(sft_cfg, rows, policy_uri=base, run_id=run_id or f"sft-{cfg.seed}", iteration=0)
    return result.checkpoint_uri, result.metrics


def warm_start(cfg, *, run_id: str) -> tuple[str, bool]:
    """The warm-start checkpoint of run ``run_id``: reused if it is already sealed in the store (a re-run of
    the demo or the learning benchmark), else trained with :func:`run_sft` (``cfg``'s ``sft_*`` settings).
    Returns (URI, reused)."""
    from rlcr.runs import RunStore

    run = RunStore.open(cfg, run_id)
    rel = run.checkpoint_rel(0)
    if run.store.is_complete(rel):
        return run.store.url(rel), True
    return run_sft(cfg, run_id=run_id)[0], False
