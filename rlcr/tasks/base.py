"""The task interface and its registry (issue 32): what a run needs from a task, by name (docs/tasks.md).

A *task* (``countdown``, ``math``, …) is a kind of problem with its rows, prompts and verifier. A task is a
subclass of :class:`Task` registered under a name with :func:`register_task`; ``rlcr.tasks.registry.get_task``
returns an instance by name, as ``rlcr.train.update`` does for objectives. Its *problems* are the rows:
whatever object the task uses (Countdown's ``CountdownTask``, math's ``MathProblem``), handled only through
the task's methods by the code that is generic over tasks.

The flow goes through this interface: a run's ``task`` setting names the task (``rlcr.config.RLCRConfig.task``)
and the rollouts, scoring, task sets, SFT, evaluation and probe call its methods (docs/tasks.md).

File reading shared by tasks lives here too (:func:`read_rows`): JSONL, Parquet, or a Hugging Face
``datasets`` dataset saved with ``save_to_disk`` (read with pyarrow alone; ``datasets`` is not needed),
each row a dict, bounded and with one-line :class:`TaskFormatError` messages naming file, row and field.
"""

from __future__ import annotations

import abc
import math
import random
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Hashable, Iterator, Mapping

from pydantic import BaseModel, ConfigDict

from rlcr.untrusted import DuplicateKey, InvalidInput, check_depth, decode_text, loads_unique, parse_json, printable

__all__ = ["Task", "TaskOptions", "TaskFormatError", "WarmStart", "ScoringStats", "TASKS", "register_task",
           "extract_answer", "read_rows", "mapped_field", "check_text", "problems_of", "CONFIDENCE_QUERY",
           "MAX_ROW_BYTES", "LEGACY_TASK"]

MAX_ROW_BYTES = 64 * 1024
"""A JSONL row longer than this (in bytes) is refused before it is parsed."""
MAX_STATE_BYTES = 1024 * 1024
"""Largest ``state.json`` of a ``save_to_disk`` directory read."""

CONFIDENCE_QUERY = (
    "How likely is your answer above to be correct? Optionally check it inside <analysis> </analysis>, "
    "then give a probability between 0 and 1 inside <confidence> </confidence>."
)
"""The turn-2 user message (docs/design.md §3): the same for every task (Countdown's text, word for word)."""

LEGACY_TASK = "countdown"
"""The task of what was stored before it named its task: rlcr ran Countdown alone until the task interface, so a
run whose stored config has no ``tasks.name`` (:func:`rlcr.runs.refs.with_run_task`) trained on Countdown, and the
rollout files of then have Countdown's schema (:data:`rlcr.rollout.records.ROLLOUT_SCHEMA`). The one name of that
fact: generic code takes its task from its caller, never from a default."""


class TaskFormatError(ValueError):
    """A task file cannot be read or has a malformed row; the one-line message names file, row, field and
    reason."""


@dataclass(frozen=True)
class WarmStart:
    """A warm-start trace of one problem (docs/design.md §14): the worked ``reasoning`` and the final
    ``answer``. :meth:`Task.warm_start_completion` renders it as the answer-turn completion."""

    reasoning: str
    answer: str


@dataclass
class ScoringStats:
    """What :meth:`Task.scoring` counts over a batch: ``timeouts``, the answers scored wrong because the
    verifier ran out of time (the rollouts' ``verifier/timeouts``)."""

    timeouts: int = 0


# --------------------------------------------------------------------------- answer extraction


def extract_answer(text: Any) -> str | None:
    """The answer-turn extraction rule (docs/design.md §4), the same for every task.

    Text after the first ``Assistant:`` (else all of it) → its last line → the content of the last
    ``<answer>…</answer>`` on that line, stripped; None when there is none (or ``text`` is no string).
    Linear ``str.find`` scans; the same results as Countdown's ``extract_solution``.
    """
    if not isinstance(text, str):
        return None
    marker = text.find("Assistant:")
    if marker >= 0:
        text = text[marker + len("Assistant:"):]
    line = text[text.rfind("\n") + 1:]
    last, pos = None, 0
    while True:
        start = line.find("<answer>", pos)
        if start < 0:
            break
        end = line.find("</answer>", start + 8)
        if end < 0:
            break
        last = (start + 8, end)
        pos = end + 9
    return None if last is None else line[last[0]:last[1]].strip()


# --------------------------------------------------------------------------- the interface


class TaskOptions(BaseModel):
    """The settings of a task's own, ``tasks.options`` of a config (docs/tasks.md): a task declares them as a
    subclass assigned to :attr:`Task.Options`, each field typed and documented by the docstring under it.
    Unknown keys are refused, floats must be finite."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False, frozen=True)


class Task(abc.ABC):
    """One kind of problem: its rows, their identity and stratum, its prompts, its verifier.

    Subclasses set :attr:`name` (through :func:`register_task`), :attr:`system_prompt` and
    :attr:`single_turn_system_prompt`, and implement the abstract methods. A task instance holds no
    per-run state: the same instance serves every run, thread and Ray worker of a process.
    """

    name: ClassVar[str] = ""
    system_prompt: ClassVar[str] = ""
    """Turn-1 system message: reasoning inside ``<think> </think>``, only the answer inside ``<answer> </answer>``."""
    single_turn_system_prompt: ClassVar[str] = ""
    """System message of the one-turn method ``rlcr_single``: the answer, then the optional analysis and the
    confidence, in one response (docs/design.md §3, §9)."""
    confidence_query: ClassVar[str] = CONFIDENCE_QUERY
    stratum_label: ClassVar[str] = "stratum"
    """What a stratum is, for tables (``rlcr eval``: "by number count", "by level")."""
    Options: ClassVar[type[TaskOptions]] = TaskOptions
    """The task's own settings (``tasks.options``): a :class:`TaskOptions` subclass; none by default."""

    def options(self, cfg: Any = None) -> TaskOptions:
        """This task's settings in ``cfg`` (an ``RLCRConfig``'s ``tasks.options``, validated when the config
        was); the defaults without a config."""
        raw = getattr(getattr(cfg, "tasks", None), "options", None)
        return self.Options.model_validate(dict(raw or {}))

    # ---- rows

    @abc.abstractmethod
    def load(self, path: str, fields: Mapping[str, str] | None = None) -> list[Any]:
        """The problems of a task file (local path or fsspec URI), in file order, repeats kept.

        ``fields`` maps the task's field names to the file's column names (``{"question": "prompt"}``);
        unmapped fields keep their own names. Raises :class:`TaskFormatError`, one line naming the file,
        the row (from 1) and the field, for anything it cannot use; never returns a partial list.
        """

    def bind(self, problems: list[Any], cfg: Any) -> list[Any]:
        """The problems of a task file as run ``cfg`` (an ``RLCRConfig``) uses them: what scoring needs from the
        task's settings attached to each problem, since :meth:`score` sees the problem alone (the ``file`` task
        attaches its checker). Default: the problems as loaded. Raises ValueError, one line, for settings that
        cannot score them."""
        return problems

    def candidates(self, seed: int, cfg: Any = None) -> Iterator[Any | None]:
        """Endless seeded stream of generated problems, deterministic in ``seed`` (and the task settings of
        ``cfg``, an ``RLCRConfig``). An item is None where a draw gave no usable problem, so a consumer can
        bound its attempts. Tasks that only read files raise ``ValueError`` saying so."""
        raise ValueError(f"task {self.name!r} has no generator: give it a task file")

    def generate(self, n: int, seed: int, cfg: Any = None) -> list[Any]:
        """The first ``n`` problems of :meth:`candidates` (not deduplicated: see :meth:`identity`)."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        out: list[Any] = []
        stream = self.candidates(seed, cfg)
        for _ in range(1000 * max(n, 1)):
            if len(out) == n:
                return out
            problem = next(stream)
            if problem is not None:
                out.append(problem)
        if len(out) == n:
            return out
        raise RuntimeError(f"task {self.name!r}: could not generate {n} problems with these settings")

    def strata(self, cfg: Any = None) -> list[Hashable]:
        """The strata a generated set holds, in order (a stratified held-out set splits its count over them);
        empty when generation draws no strata (no quota)."""
        return []

    @abc.abstractmethod
    def identity(self, problem: Any) -> Hashable:
        """What makes two problems the same: equal identities are one problem (the training pool and the
        held-out set share none). Hashable, cheap, independent of the reference solution."""

    @abc.abstractmethod
    def stratum(self, problem: Any) -> Hashable:
        """The problem's stratum for stratified held-out sets and per-stratum metrics (Countdown: the count
        of numbers; math: the ``level`` when the data has one, else one stratum for all). A str or int."""

    @abc.abstractmethod
    def to_record(self, problem: Any) -> dict[str, Any]:
        """The problem as a flat dict of JSON-serialisable values: a Ray Data row and the task fields of a
        rollout record. ``from_record(to_record(p))`` is ``p`` for everything scoring and prompts read."""

    @abc.abstractmethod
    def from_record(self, record: Mapping[str, Any]) -> Any:
        """The problem of a :meth:`to_record` dict (extra keys ignored)."""

    def record_fields(self) -> list[Any]:
        """The pyarrow fields of :meth:`to_record`'s keys: the task columns of the rollout records' schema
        (``rlcr.rollout.records.rollout_schema``). A task the flow runs must declare them."""
        raise NotImplementedError(f"task {self.name!r} declares no record_fields: the flow cannot store its rollouts")

    # ---- prompts (docs/design.md §3)

    @abc.abstractmethod
    def user_text(self, problem: Any) -> str:
        """The turn-1 user message: the problem and how to write the answer."""

    def turn1_messages(self, problem: Any, system_prompt: str | None = None) -> list[dict[str, str]]:
        """Turn-1 conversation: system + user (the problem). Rendered with the tokenizer's chat template."""
        return [{"role": "system", "content": self.system_prompt if system_prompt is None else system_prompt},
                {"role": "user", "content": self.user_text(problem)}]

    def turn2_messages(self, problem: Any, answer_text: str, system_prompt: str | None = None,
                       confidence_query: str | None = None) -> list[dict[str, str]]:
        """Turn-2 conversation: turn 1 + that exact answer as the assistant message + the confidence query."""
        query = self.confidence_query if confidence_query is None else confidence_query
        return self.turn1_messages(problem, system_prompt) + [
            {"role": "assistant", "content": answer_text}, {"role": "user", "content": query}]

    def single_turn_messages(self, problem: Any) -> list[dict[str, str]]:
        """The one-turn conversation of ``rlcr_single``: answer, then its confidence, in the same response."""
        return self.turn1_messages(problem, self.single_turn_system_prompt)

    # ---- verifier (docs/design.md §4, §5)

    @abc.abstractmethod
    def score(self, completion: Any, problem: Any, *, format_score: float, score: float = 1.0) -> float:
        """Score an answer-turn completion: ``0`` when no answer is extracted (:func:`extract_answer`: a format
        error); ``format_score`` when one is extracted but is not accepted (wrong, unparseable, over a size or
        time bound); ``score`` when it is right. Bounded in time and memory whatever ``completion`` holds, in
        any thread; never raises on model output and never prints it."""

    def scoring(self, n: int) -> AbstractContextManager[Any]:
        """A context in which this thread scores ``n`` completions as one batch (the rollouts' scoring step);
        it yields an object whose ``timeouts`` counts the answers scored wrong because the verifier ran out of
        time (a :class:`ScoringStats` by default, which a verifier without timeouts leaves at 0)."""
        return nullcontext(ScoringStats())

    def accuracy(self, completion: Any, problem: Any) -> float:
        """The accuracy reward (docs/design.md §5): 1.0 iff :meth:`score` gives the full score, else 0.0."""
        return 1.0 if self.score(completion, problem, format_score=0.0, score=1.0) == 1.0 else 0.0

    # ---- warm start (docs/design.md §14)

    def warm_start(self, problem: Any, rng: random.Random) -> WarmStart | None:
        """A worked trace of ``problem`` for the SFT warm-start, or None when it has none. Contract: the
        answer of :meth:`warm_start_completion` scores the full score. The default: no traces."""
        return None

    def warm_start_completion(self, trace: WarmStart) -> str:
        """The answer-turn completion of a trace: ``<think>reasoning</think>`` then the answer line."""
        return f"<think>{trace.reasoning}</think>\n<answer>{trace.answer}</answer>"

    def sft_problem(self, problem: Any) -> Any | None:
        """``problem`` ready for the warm-start (e.g. with a checked reference solution), or None when it has no
        warm-start trace. Default: the problem itself when :meth:`warm_start` gives a trace."""
        return problem if self.warm_start(problem, random.Random(0)) is not None else None

    def warm_start_examples(self, problems: Any, seed: int, *, single_turn: bool = False) -> list[dict[str, Any]]:
        """The SFT warm-start's chat examples of ``problems`` (each of :meth:`sft_problem`), as ``rlcr.train.sft``
        trains
        on them: ``{"messages", "completion", "sample_type", "task", "loss_from"}``, two per problem (turn 1,
        turn 2), then with ``single_turn`` one more per problem in the one-turn format.

        Default (tasks without a programmatic check of an answer's reasoning, e.g. ``math``): turn 1 is the
        :meth:`warm_start` trace; turn 2 and the one-turn example's tail are **format only**: a bare
        ``<confidence>c</confidence>`` after that (right) answer, ``c`` drawn from :data:`FORMAT_ONLY_CONFIDENCES`.
        They teach where and how the confidence is written, not what it should be: with only right answers
        shown, the SFT's Brier target carries no calibration signal, which RL's confidence reward then supplies.
        """
        rng = random.Random(seed)
        out, answers = [], []
        for p in problems:
            trace = self.warm_start(p, rng)
            if trace is None:
                raise ValueError(f"task {self.name!r}: a warm-start problem has no trace (pass sft_problem's)")
            answer = self.warm_start_completion(trace)
            answers.append(answer)
            out.append({"messages": self.turn1_messages(p), "completion": answer, "sample_type": "answer",
                        "task": p, "loss_from": 0})
            out.append({"messages": self.turn2_messages(p, answer), "sample_type": "confidence", "task": p,
                        "completion": f"<confidence>{rng.choice(FORMAT_ONLY_CONFIDENCES)}</confidence>",
                        "loss_from": 0})
        if single_turn:
            for p, answer in zip(problems, answers):
                out.append({"messages": self.single_turn_messages(p), "sample_type": "answer", "task": p,
                            "completion": f"{answer}\n<confidence>{rng.choice(FORMAT_ONLY_CONFIDENCES)}</confidence>",
                            "loss_from": 0})
        return out


FORMAT_ONLY_CONFIDENCES = (0.5, 0.6, 0.7, 0.8, 0.9)
"""The confidences a format-only warm-start example states (:meth:`Task.warm_start_examples`): spread, so the
G_c confidences of one answer differ from the start and RL's confidence advantages have signal."""


# --------------------------------------------------------------------------- the registry

TASKS: dict[str, type[Task]] = {}
"""The tasks a config may name, by name."""


def register_task(name: str) -> Callable[[type[Task]], type[Task]]:
    """Class decorator registering a :class:`Task` subclass as ``name`` (refused if taken)."""

    def register(cls: type[Task]) -> type[Task]:
        if not (isinstance(cls, type) and issubclass(cls, Task)):
            raise TypeError(f"register_task({name!r}) decorates a Task subclass, got {cls!r}")
        taken = TASKS.get(name)
        reimport = (taken is not None and taken is not cls
                    and (taken.__module__, taken.__qualname__) == (cls.__module__, cls.__qualname__))
        if taken is not None and not reimport:  # a module imported again (by path, then by name) replaces its own
            raise ValueError(f"task {name!r} is already registered")
        cls.name = name
        TASKS[name] = cls
        return cls

    return register


# --------------------------------------------------------------------------- reading task files


def mapped_field(row: Mapping[str, Any], name: str, fields: Mapping[str, str] | None) -> tuple[str, Any]:
    """(column, value) of the task field ``name`` in ``row`` under the mapping ``fields`` (value None when
    the column is absent or null)."""
    column = (fields or {}).get(name, name)
    value = row.get(column)
    if value is not None and hasattr(value, "item") and not isinstance(value, (list, dict, str)):
        value = value.item()  # a NumPy/Arrow scalar
    return column, value


def read_rows(path: Any) -> Iterator[tuple[int, dict[str, Any]]]:
    """(row number from 1, row) of a JSONL file (``.jsonl``/``.json``, one object a line; blank lines
    skipped), a Parquet file (``.parquet``) or a ``save_to_disk`` directory (holding ``state.json``).

    Local paths and fsspec URIs. Bounded: a JSONL row over :data:`MAX_ROW_BYTES`, not UTF-8 or nested
    deeper than ``rlcr.untrusted.MAX_DEPTH`` is refused before it is parsed. Errors: one-line
    :class:`TaskFormatError` naming the file (and the row).
    """
    import fsspec

    path = str(path)
    try:
        fs, root = fsspec.core.url_to_fs(path)
        if fs.isdir(root):
            yield from _saved_dataset_rows(fs, root, path)
        elif path.endswith(".parquet"):
            yield from _parquet_rows(fs, root, path)
        elif path.endswith((".jsonl", ".json")):
            yield from _jsonl_rows(fs, root, path)
        elif not fs.exists(root):
            raise FileNotFoundError(2, "No such file or directory")
        else:
            raise TaskFormatError(f"{printable(path)}: unsupported task file type (expected .jsonl, .parquet "
                                  "or a directory written by datasets' save_to_disk)")
    except OSError as e:
        reason = printable(e.strerror or f"{type(e).__name__}: {e}", 160)
        raise TaskFormatError(f"{printable(path)}: cannot read the task file ({reason})") from None


def _jsonl_rows(fs: Any, root: str, path: str) -> Iterator[tuple[int, dict[str, Any]]]:
    with fs.open(root, "rb") as f:
        lineno = 0
        while line := f.readline(MAX_ROW_BYTES + 1):
            lineno += 1
            where = f"{printable(path)}: row {lineno}"
            if len(line) > MAX_ROW_BYTES:
                raise TaskFormatError(f"{where}: longer than the {MAX_ROW_BYTES:,} bytes a task row may hold")
            try:
                text = decode_text(line, where)
                if not text.strip():
                    continue
                check_depth(text, where)
                row = loads_unique(text)
            except InvalidInput as e:
                raise TaskFormatError(str(e)) from None
            except DuplicateKey as e:  # the row is the line: "row 3" names the line
                raise TaskFormatError(f"{where}: {e}") from None
            except ValueError as e:  # JSONDecodeError, or an integer beyond the int-string limit
                raise TaskFormatError(f"{where}: not valid JSON ({printable(e, 120)})") from None
            yield lineno, _object(row, where)


def _object(row: Any, where: str) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise TaskFormatError(f"{where}: expected an object, got {type(row).__name__}")
    return row


def _parquet_rows(fs: Any, root: str, path: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """Rows of a Parquet file, read in bounded memory (:func:`rlcr.columnar.parquet_batches`: the footer's
    rows and sizes checked first, then batches whose decoded size is counted before they are decoded)."""
    from rlcr.columnar import parquet_batches

    index = 0
    with fs.open(root, "rb") as f:
        try:
            for batch in parquet_batches(f, path):
                for row in batch.to_pylist():
                    index += 1
                    yield index, row
        except InvalidInput as e:
            raise TaskFormatError(str(e)) from None


def _saved_dataset_rows(fs: Any, root: str, path: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """Rows of a ``datasets.Dataset.save_to_disk`` directory: ``state.json`` lists its Arrow stream files, read
    one message at a time within one budget of rows and bytes (:func:`rlcr.columnar.ipc_stream_batches`)."""
    from rlcr.columnar import ipc_stream_batches

    root = root.rstrip("/")
    if fs.exists(f"{root}/dataset_dict.json"):
        splits = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(root, detail=False) if fs.isdir(p))
        raise TaskFormatError(f"{printable(path)}: a DatasetDict; point at one split's directory (splits: "
                              f"{printable(', '.join(splits), 120)})")
    state_path = f"{root}/state.json"
    if not fs.exists(state_path):
        raise TaskFormatError(f"{printable(path)}: a directory without state.json (not written by save_to_disk)")
    with fs.open(state_path, "rb") as f:
        data = f.read(MAX_STATE_BYTES + 1)
    try:
        state = parse_json(data, f"{path}/state.json", max_bytes=MAX_STATE_BYTES)
    except InvalidInput as e:
        raise TaskFormatError(str(e)) from None
    files = state.get("_data_files")
    if not isinstance(files, list) or not files:
        raise TaskFormatError(f"{printable(path)}/state.json: field '_data_files' must be a non-empty list")
    index, spent = 0, [0, 0]
    for k, entry in enumerate(files):
        name = entry.get("filename") if isinstance(entry, dict) else None
        if (not isinstance(name, str) or "/" in name or "\\" in name or name.startswith(".")
                or not name.endswith(".arrow")):
            raise TaskFormatError(f"{printable(path)}/state.json: '_data_files' item {k} is not an .arrow file name "
                                  "in the directory")
        with fs.open(f"{root}/{name}", "rb") as f:
            try:
                for batch in ipc_stream_batches(f, f"{path}/{name}", spent=spent):
                    for row in batch.to_pylist():
                        index += 1
                        yield index, row
            except InvalidInput as e:
                raise TaskFormatError(str(e)) from None


def check_text(value: Any, where: str, name: str, max_chars: int, *, required: bool = True) -> str | None:
    """``value`` as a str field of at most ``max_chars`` characters (None allowed unless ``required``)."""
    if value is None:
        if required:
            raise TaskFormatError(f"{where}: field '{name}' is missing")
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise TaskFormatError(f"{where}: field '{name}' must be a string, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):  # NaN: how pandas writes a missing value
        if math.isnan(value) and not required:
            return None
        raise TaskFormatError(f"{where}: field '{name}' is " + ("missing (NaN)" if math.isnan(value) else
                                                               f"not a finite number ({value})"))
    text = value if isinstance(value, str) else str(value)
    if len(text) > max_chars:
        raise TaskFormatError(f"{where}: field '{name}' is longer than {max_chars:,} characters ({len(text):,})")
    return text


def problems_of(path: Any, build: Callable[[Mapping[str, Any], str], Any]) -> list[Any]:
    """``build(row, where)`` over :func:`read_rows` of ``path`` (``where`` names file and row for errors)."""
    name = printable(str(path))
    return [build(row, f"{name}: row {n}") for n, row in read_rows(path)]
