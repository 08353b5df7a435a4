"""The progress of long work as a person follows it: a long step of the ``rlcr`` command (a spinner on a
terminal, timestamped start/done lines off one) and the training flow's stages (a rich bar on a terminal, one
plain line per stage start and finish off one, with its headline figures). Fed by :mod:`rlcr.events`; a display
never fails the work it follows. Tables and number formats are :mod:`rlcr.ui.presentation`'s."""

from __future__ import annotations

import contextlib
import math
import time
from contextlib import contextmanager
from typing import Callable, Iterator, Optional

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from rlcr.ui.presentation import console, fmt
from rlcr.untrusted import printable

__all__ = ["elapsed", "plain", "step", "StageProgress", "committed_figures", "figures_text", "progress_text",
           "ProgressLines", "PROGRESS_EVERY_S"]

def elapsed(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 100 else f"{seconds / 60:.1f} min"


def plain(out: Console, message: str) -> None:
    """One timestamped plain line, flushed now (off a terminal stdout is block-buffered)."""
    out.print(f"[{time.strftime('%H:%M:%S')}] {message}", markup=False, highlight=False, emoji=False, soft_wrap=True)
    out.file.flush()


PROGRESS_EVERY_S = 10.0
"""Off a terminal, a long stage's progress (``k/n``) is a line at most this often, and when the part is done."""


def progress_text(event) -> str:
    """``"answers 3/8 tasks"``: a :func:`rlcr.events.progress` event's figures."""
    f = event.figures
    return " ".join(x for x in (str(f.get("part") or ""), f"{f.get('done')}/{f.get('total')}", str(f.get("unit") or ""))
                    if x)


class ProgressLines:
    """Progress events (:func:`rlcr.events.progress`) as plain lines off a terminal: the first of a part, then at
    most one per :data:`PROGRESS_EVERY_S`, and the one that completes it."""

    def __init__(self, out: Console, label: str):
        self.out, self.label, self.last = out, label, (None, -math.inf, None)

    def __call__(self, event, label: Optional[str] = None) -> None:
        if event.phase != "progress":
            return
        try:
            part, now, f = event.figures.get("part"), time.perf_counter(), event.figures
            if part == self.last[0] and (f.get("done") == self.last[2] or (
                    now - self.last[1] < PROGRESS_EVERY_S and f.get("done") != f.get("total"))):
                return
            self.last = (part, now, f.get("done"))
            plain(self.out, f"{label or self.label}: {progress_text(event)}")
        except Exception:  # noqa: BLE001 — a display never fails the work it follows
            pass


@contextmanager
def step(label: str, out: Optional[Console] = None) -> Iterator[None]:
    """A long step: a spinner on a terminal; off one (a log file, CI), where a spinner prints nothing,
    a plain line when it starts and one when it is done or failed, with its elapsed time. Progress events of
    the work inside (:func:`rlcr.events.progress`: ``k/n`` tasks) follow the label, or are lines of their own."""
    from rlcr import events

    out = out or console
    if out.is_terminal:
        with out.status(Text(label)) as status:  # not markup: a label may name a file
            def show_progress(event) -> None:
                if event.phase == "progress":
                    with contextlib.suppress(Exception):  # a display never fails the work it follows
                        status.update(Text(f"{label} — {progress_text(event)}"))

            with events.subscribed(show_progress):
                yield
        return
    t0 = time.perf_counter()
    plain(out, f"{label}: started")
    lines = ProgressLines(out, label)
    try:
        with events.subscribed(lines):
            yield
    except BaseException as e:
        plain(out, f"{label}: failed after {elapsed(time.perf_counter() - t0)} ({type(e).__name__})")
        raise
    plain(out, f"{label}: done in {elapsed(time.perf_counter() - t0)}")


class StageProgress:
    """Progress of the training flow, fed by its stage events; use as
    ``with events.subscribed(bar.on_event), bar: rlcr_train(...)``.

    On a terminal: a rich progress bar. Off one (``make demo > demo.log``, CI), where rich's bars print
    nothing: one plain, flushed line per stage start and per stage finish, with the elapsed time and,
    where known, the stage's headline figures. :meth:`on_event` takes :class:`rlcr.events.StageEvent`
    (start; end with elapsed time and figures); ``bar(stage, iteration)`` is a stage's start. A stage without an end
    event is done when the next one starts or when the flow returns; the same stage started again means Prefect retried
    it. When an end event carries no figures, ``figures(stage, iteration)`` may supply them (:func:`committed_figures`
    reads the baseline evaluation and a committed iteration's metrics from the run's files). A display
    never fails the flow it watches.
    """

    LABELS = {"baseline": "held-out evaluation of the starting policy",
              "rollouts": "generating answers → confidences", "advantages": "advantages + rollouts Parquet",
              "update": "GRPO update (Ray Train)", "sync_weights": "new weights → engines (in memory)",
              "evaluate": "held-out evaluation", "stage": "metrics written (pending until the state is saved)",
              "save": "training state → storage", "saved": "waiting for the background save",
              "commit": "commit"}

    STARTUP = {"prefect": "Prefect", "model": "model", "ray": "Ray", "engines": "vLLM engines",
               "trainer": "trainer (Ray Train)"}
    """The flow's start-up phases (:data:`rlcr.events.STARTUP`): each is named when it starts and ends with its
    time (``start-up: Ray ready in 4.2 s``); engines and trainer may overlap."""

    def __init__(self, total: int, start: int, figures: Optional[Callable[[str, int], Optional[str]]] = None,
                 out: Optional[Console] = None, title: str = "training", redirect: bool = True):
        self.console = out or console
        self.plain = not self.console.is_terminal
        self.total, self.start, self.figures, self.title = total, start, figures, title
        # redirect: rich shows what others print above the bar (off while rlcr.ui.terminal routes it to a log file)
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(bar_width=20),
                                 TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                                 console=self.console, disable=self.plain, redirect_stdout=redirect,
                                 redirect_stderr=redirect)
        self.starting: dict[str, float] = {}  # start-up phase → started at
        self.current_label = ""  # on a terminal: the description of the stage running
        self.lines = ProgressLines(self.console, "progress")
        self.task = self.progress.add_task("iterations", total=total, completed=start - 1)
        self.committed = start - 1  # the iterations committed (the bar's count: a staged one is not yet)
        self.running: Optional[tuple[str, int]] = None  # the (stage, iteration) started last
        self.current: Optional[tuple[str, int, float]] = None  # (stage, iteration, started at)
        self.beside: Optional[tuple[str, int, float]] = None  # one-step-off: rollouts running beside the update
        self.iteration_t0: dict[int, float] = {}
        self.t0 = time.perf_counter()

    def __enter__(self) -> "StageProgress":
        self.t0 = time.perf_counter()
        if self.plain:
            todo = (f"iterations {self.start}..{self.total}" if self.start <= self.total
                    else f"all {self.total} iterations already committed")
            plain(self.console, f"{self.title}: started ({todo})")
        else:
            self.progress.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self.plain:
            self.progress.stop()
            return
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
            return  # the interrupt's own lines say what stopped (rlcr.cli.interrupt)
        self._safely(self._finish, time.perf_counter(), exc)
        took = elapsed(time.perf_counter() - self.t0)
        plain(self.console, f"{self.title}: failed after {took} ({exc_type.__name__})" if exc_type
               else f"{self.title}: done in {took}")

    def stop_display(self) -> None:
        """Stop the live bar where it stands (a Ctrl-C: the lines that follow are the interrupt's)."""
        if not self.plain:
            self.progress.stop()

    def doing(self) -> str:
        """What the flow is doing now, as a phrase (``iteration 3's update``), for the interrupt's line."""
        if self.running is None:
            return "start-up"
        stage, iteration = self.running
        if not iteration:
            return "the baseline evaluation" if stage in ("baseline", "evaluate") else "start-up"
        return f"iteration {iteration}'s {self.DOING.get(stage, stage)}"

    DOING = {"rollouts": "generation", "advantages": "advantages", "update": "update", "sync_weights": "weight sync",
             "evaluate": "held-out evaluation", "stage": "metrics", "save": "save", "saved": "save",
             "commit": "commit"}

    def __call__(self, stage: str, iteration: int) -> None:
        self.running = (stage, iteration)
        if self.plain:
            self._safely(self._plain_event, stage, iteration)
            return
        label = self.LABELS.get(stage, stage)
        self.current_label = f"iteration {iteration}: {label}" if iteration else label
        self.progress.update(self.task, description=self.current_label)

    def on_event(self, event) -> None:
        """A stage event with a phase: ``event.stage``, ``.iteration``, ``.phase`` (``"start"`` or
        ``"end"``) and, at the end, ``.elapsed_s`` and ``.figures`` (``{"answer reward": 0.31, …}``)."""
        if event.phase == "progress":
            self._safely(self._progress, event)
        elif event.stage in self.STARTUP:
            self._safely(self._startup, event)
        elif event.phase == "start":
            self(event.stage, event.iteration)
        else:
            if event.stage == "commit" and event.iteration > self.committed:
                self.committed = event.iteration  # iterations commit in order: through this one
                if not self.plain:
                    self.progress.update(self.task, completed=self.committed)
            if self.plain:
                self._safely(self._finish, time.perf_counter(), None, event)

    def _progress(self, event) -> None:
        """Progress inside the stage running (a held-out evaluation: ``k/n`` tasks)."""
        if self.plain:
            self.lines(event, self._name(event.stage, event.iteration))
        elif self.current_label:
            self.progress.update(self.task, description=f"{self.current_label} {progress_text(event)}")

    def _startup(self, event) -> None:
        now, name = time.perf_counter(), self.STARTUP[event.stage]
        if event.phase == "start":
            self.starting[event.stage] = now
            line = f"start-up: {name}…"
        else:
            t0 = self.starting.pop(event.stage, None)
            took = event.elapsed_s if event.elapsed_s is not None else (now - t0 if t0 is not None else None)
            line = f"start-up: {name} ready" + (f" in {elapsed(took)}" if took is not None else "")
        if self.plain:
            plain(self.console, line)
            return
        if event.phase == "end":
            self.console.print(line, markup=False, highlight=False)
        names = ", ".join(self.STARTUP[s] for s in self.starting)
        self.progress.update(self.task, description=f"starting {names}" if names else "iterations")

    # ---------------------------------------------------------------- off a terminal
    @staticmethod
    def _name(stage: str, iteration: int) -> str:
        return f"iteration {iteration} {stage}" if iteration else "baseline evaluation"

    def _plain_event(self, stage: str, iteration: int) -> None:
        now = time.perf_counter()
        if self.current is not None and self.current[:2] == (stage, iteration):
            plain(self.console, f"{self._name(stage, iteration)}: failed after {elapsed(now - self.current[2])}, "
                                 "retrying")
        elif stage == "rollouts" and self.current is not None and self.current[:2] == ("update", iteration - 1):
            # one-step-off (orchestration.mode): the next rollouts run beside the update; both go on
            self.beside, self.iteration_t0[iteration] = (stage, iteration, now), now
            plain(self.console, f"{self._name(stage, iteration)}: started — {self.LABELS[stage]} (beside the update)")
            return
        else:
            self._finish(now)
            if stage == "rollouts":
                self.iteration_t0[iteration] = now
            plain(self.console, f"{self._name(stage, iteration)}: started — {self.LABELS.get(stage, stage)}")
        self.current = (stage, iteration, now)

    def _finish(self, now: float, exc: Optional[BaseException] = None, event=None) -> None:
        """The line for the stage in progress (or the one ``event`` ends): done with its figures, or
        failed with ``exc``."""
        if event is not None:
            stage, iteration = event.stage, event.iteration
            t0 = self.current[2] if self.current and self.current[:2] == (stage, iteration) else now
            if event.elapsed_s is not None:
                t0 = now - event.elapsed_s
        elif self.current is not None:
            stage, iteration, t0 = self.current
        else:
            return
        if self.current is not None and self.current[:2] == (stage, iteration):
            self.current, self.beside = self.beside, None  # a stage running beside goes on
        name, took = self._name(stage, iteration), elapsed(now - t0)
        if exc is not None:
            plain(self.console, f"{name}: failed after {took} ({type(exc).__name__}: {printable(exc, 500)})")
            return
        parts = []
        if stage == "stage" and iteration in self.iteration_t0:
            parts.append(f"iteration {iteration}/{self.total} in {elapsed(now - self.iteration_t0[iteration])}")
        figure = figures_text((getattr(event, "figures", None) or {}).items())
        if figure is None and self.figures:
            figure = self._safely(self.figures, stage, iteration)
        if figure:
            parts.append(figure)
        plain(self.console, f"{name}: done in {took}" + (f" ({'; '.join(parts)})" if parts else ""))

    def _safely(self, fn, *args):
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001 — the display must never fail a stage of the flow
            try:
                plain(self.console, f"(progress display error: {type(e).__name__}: {printable(e, 500)})")
            except Exception:  # noqa: BLE001
                pass
            return None


def committed_figures(cfg, run_id: str) -> Callable[[str, int], Optional[str]]:
    """Headline figures of finished stages, read from run ``run_id``'s files: the baseline evaluation
    once it is written, an iteration's rollout rewards, update loss and held-out accuracy and ECE once
    its metrics are written (``stage``; before that, None)."""
    from rlcr.runs.store import RunStore

    run = RunStore.open(cfg, run_id)

    def figures(stage: str, iteration: int) -> Optional[str]:
        if iteration == 0 and stage in ("evaluate", "baseline"):
            rel = run.baseline_rel
            ev = run.store.read_json(rel)["eval"] if run.store.exists(rel) else {}
            return figures_text((("accuracy", ev.get("accuracy")), ("ECE", ev.get("ece"))))
        if stage != "stage" or not run.store.exists(run.metrics_rel(iteration)):
            return None
        met = run.store.read_json(run.metrics_rel(iteration))
        ro, up, ev = met.get("rollout", {}), met.get("update", {}), met.get("eval", {})
        return figures_text((("answer reward", ro.get("answer/reward_mean")),
                         ("confidence reward", ro.get("confidence/reward_mean")), ("loss", up.get("loss")),
                         ("held-out accuracy", ev.get("accuracy")), ("ECE", ev.get("ece")),
                         ("logπ mismatch", up.get("mismatch/answer/mean_abs"))))

    return figures


def figures_text(pairs) -> Optional[str]:
    text = ", ".join(f"{k} {fmt(v)}" for k, v in pairs if v is not None)
    return text or None
