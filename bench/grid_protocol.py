"""The pre-registered protocol of the methods grid (bench/protocol.yaml, issue 35): read and checked, and its
fixed task split. Pure Python: no Ray, vLLM or Prefect (tests/test_grid.py).

* :func:`load_protocol` — the protocol file, every field checked; a missing, unknown or mistyped field is a
  one-line :class:`ProtocolError` naming it (``bench/protocol.yaml: shared.learning_rat: unknown field …``).
* :func:`build_split` — one split for every seed and method, drawn from ``tasks.split_seed`` alone: the
  training pool (``train_pool_tasks`` distinct tasks, as the generator draws them), then the test split
  (``test_tasks``, the strata in equal shares, none a training task), then the calibration split
  (``calibration_tasks``, equal shares, none a training or test task). Each part is a generated held-out set
  (:func:`rlcr.runs.task_sets.held_out_set`) of its own seed (:func:`rlcr.seeds.mix` of ``split_seed`` and the part's
  salt) that excludes the parts before it.
* :func:`check_disjoint` — the protocol's disjointness rule, by task identity: test ∩ calibration = ∅, neither
  meets the training pool, and each seed's warm-start tasks lie in the training pool. A violation raises
  :class:`SplitError`: the grid stops before any training.
"""

from __future__ import annotations

import datetime
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from rlcr.untrusted import printable

METHODS = ("rlcr", "rlvr", "rlcr_single")
GOALS = ("brier_skill", "within_stratum_auroc", "ece", "accuracy_non_inferior")
"""The decision rules of the protocol, as :func:`rlcr.evaluation.protocol_stats.decide` names them."""
SPLIT_SALTS = {"train": 1, "test": 2, "calibration": 3}
"""Each part of the split is drawn from ``mix(split_seed, salt)`` (:func:`rlcr.seeds.mix`); never change these."""
EQUAL_TOKEN = "equal-token"


class ProtocolError(ValueError):
    """The protocol file is invalid; the one-line message names the file and the field."""


class SplitError(ValueError):
    """The split breaks the protocol's disjointness rule (or the store holds another split)."""


# ----------------------------------------------------------------------------------------------- validation
def _int(lo: int = 0) -> Callable[[Any], Any]:
    def check(v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"must be an integer, got {v!r}")
        if v < lo:
            raise TypeError(f"must be >= {lo}, got {v}")
        return v
    return check


def _number(v: Any) -> Any:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"must be a number, got {v!r}")
    return float(v)


def _bool(v: Any) -> Any:
    if not isinstance(v, bool):
        raise TypeError(f"must be true or false, got {v!r}")
    return v


def _text(v: Any) -> Any:
    if not isinstance(v, str) or not v.strip():
        raise TypeError(f"must be a non-empty string, got {v!r}")
    return v


def _date(v: Any) -> Any:
    if isinstance(v, datetime.date):
        return v.isoformat()
    try:
        return datetime.date.fromisoformat(str(v)).isoformat()
    except ValueError:
        raise TypeError(f"must be a date (YYYY-MM-DD), got {v!r}") from None


def _starts(prefix: str) -> Callable[[Any], Any]:
    def check(v: Any) -> Any:
        if not isinstance(v, str) or not v.strip().lower().startswith(prefix):
            raise TypeError(f"must start with {prefix!r} (the only setting the grid runs), got {v!r}")
        return v
    return check


def _seeds(v: Any) -> Any:
    if not isinstance(v, list) or not v or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in v):
        raise TypeError(f"must be a non-empty list of integers >= 0, got {v!r}")
    if len(set(v)) != len(v):
        raise TypeError(f"repeats a seed: {v!r}")
    return v


def _group_size(v: Any) -> Any:
    if isinstance(v, str) and v.strip().startswith(EQUAL_TOKEN):
        return EQUAL_TOKEN
    return _int(2)(v)


def _metrics(v: Any) -> Any:
    if not isinstance(v, list) or not v:
        raise TypeError(f"must be a non-empty list, got {v!r}")
    return v


_METHOD = {"num_generations_answer": _group_size, "num_generations_confidence": _int(2), "lambda_conf": _number}
SPEC: dict[str, Any] = {
    "version": _int(1), "registered": _date,
    "tasks": {"task": _text, "config": _text, "split_seed": _int(0), "test_tasks": _int(1),
              "calibration_tasks": _int(1), "train_pool_tasks": _int(1), "disjointness": _text, "strata": _text},
    "shared": {"model": _text, "warm_start": {"sft_tasks": _int(1), "sft_epochs": _int(1), "sft_single_turn": _bool},
               "prompts_per_iteration": _int(1), "temperature": _number, "learning_rate": _number,
               "scale_by_std": _bool, "conf_norm_mode": _text, "loss_agg": _text, "clip_high": _number,
               "iterations": _int(1)},
    "methods": {m: _METHOD for m in METHODS},
    "seeds": _seeds,
    "evaluation": {"checkpoint": _text,
                   "primary": {"decoding": _starts("sampling"), "answers_per_task": _int(1), "draws": _int(1),
                               "unparsed_confidence": _starts("excluded")},
                   "paper_protocol": {"decoding": _starts("greedy"), "answers_per_task": _int(1),
                                      "unparsed_confidence": _starts("counted as confidence 0")},
                   "baselines": {"warm_start": _text, "difficulty_prior": _text, "recalibrated_rlvr": _text}},
    "metrics": _metrics, "intervals": _text, "goals": {g: _text for g in GOALS}, "secondary": _text,
}
OPTIONAL = {"methods.rlcr_single", "methods.rlvr.num_generations_confidence",
            "methods.rlcr_single.num_generations_confidence", "secondary", "registered"}
"""Fields a protocol may leave out (a one-turn method has no G_c; rlcr_single may be left out of a grid)."""

SHARED_FIELDS = {"model": "model.name", "warm_start.sft_tasks": "sft.tasks", "warm_start.sft_epochs": "sft.epochs",
                 "warm_start.sft_single_turn": "sft.single_turn",
                 "prompts_per_iteration": "rollout.prompts_per_iteration", "temperature": "rollout.temperature",
                 "learning_rate": "update.learning_rate", "scale_by_std": "method.scale_by_std",
                 "conf_norm_mode": "method.conf_norm_mode", "loss_agg": "loss.agg", "clip_high": "loss.clip_high",
                 "iterations": "run.iterations"}
METHOD_FIELDS = {"num_generations_answer": "rollout.num_generations_answer",
                 "num_generations_confidence": "rollout.num_generations_confidence",
                 "lambda_conf": "method.lambda_conf"}


def _check(doc: Any, spec: Any, where: str, source: str, optional: frozenset | set = frozenset(OPTIONAL)) -> Any:
    """``doc`` checked against ``spec`` (a nested dict of checks): every field known, present (unless
    ``optional``, :data:`OPTIONAL` by default) and of its type; returns the checked values."""
    if callable(spec):
        try:
            return spec(doc)
        except TypeError as e:
            raise ProtocolError(f"{source}: {where}: {printable(e, 200)}") from None
    if not isinstance(doc, dict):
        raise ProtocolError(f"{source}: {where or 'the file'}: must be a mapping, got {printable(repr(doc), 80)}")
    unknown = sorted(str(k) for k in doc if k not in spec)
    if unknown:
        raise ProtocolError(f"{source}: {(where + '.') if where else ''}{printable(unknown[0], 60)}: unknown field "
                            f"(known: {', '.join(spec)})")
    out = {}
    for key, sub in spec.items():
        name = f"{where}.{key}" if where else key
        if key not in doc:
            if name in optional:
                continue
            raise ProtocolError(f"{source}: {name}: missing")
        out[key] = _check(doc[key], sub, name, source, optional)
    return out


@dataclass(frozen=True)
class Decoding:
    """One evaluation protocol: answers per task, temperature (None: the training one; 0: greedy), and whether
    an unparsed confidence counts as 0 (else it is left out of the calibration metrics)."""

    name: str
    answers_per_task: int
    temperature: float | None
    unparsed_as_zero: bool


@dataclass(frozen=True)
class Protocol:
    """What bench/protocol.yaml fixes, in the terms the grid runs it in."""

    source: str
    config: str
    task: str
    split_seed: int
    sizes: dict[str, int]
    seeds: list[int]
    iterations: int
    shared: list[str]
    methods: dict[str, list[str]]
    equal_token: list[str]
    decodings: tuple[Decoding, Decoding]
    n_resamples: int
    level: float
    raw: dict[str, Any] = field(repr=False, default_factory=dict)

    def overrides(self, method: str | None = None) -> list[str]:
        """``section.field=value`` overrides of the shared settings (and of ``method``'s own)."""
        return [*self.shared, "tasks.name=" + self.task, *(self.methods[method] if method else [])]


def _flat(doc: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in doc.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _override(name: str, value: Any) -> str:
    return f"{name}={json.dumps(value) if isinstance(value, (bool, str)) else value}"


def load_protocol(path: str | Path) -> Protocol:
    """The protocol file at ``path``, checked (:class:`ProtocolError`, one line, naming the field)."""
    from rlcr.config.loading import ConfigError, read_config_text, safe_yaml

    source = printable(path)
    try:
        doc = _check(safe_yaml(read_config_text(path), source), SPEC, "", source)
    except ConfigError as e:
        raise ProtocolError(str(e)) from None
    t, shared, methods, ev = doc["tasks"], doc["shared"], doc["methods"], doc["evaluation"]
    if "rlcr" not in methods or "rlvr" not in methods:
        raise ProtocolError(f"{source}: methods: needs rlcr and rlvr (the goals compare them)")
    if methods["rlcr"]["num_generations_answer"] == EQUAL_TOKEN or "num_generations_confidence" not in methods["rlcr"]:
        raise ProtocolError(f"{source}: methods.rlcr: needs integer num_generations_answer and "
                            "num_generations_confidence (the others' group sizes are matched to rlcr's tokens)")
    checkpoint = re.fullmatch(r"\s*iteration (\d+)\b.*", ev["checkpoint"], flags=re.S)
    if not checkpoint or int(checkpoint.group(1)) != shared["iterations"]:
        raise ProtocolError(f"{source}: evaluation.checkpoint: must read 'iteration {shared['iterations']} …' "
                            f"(shared.iterations), got {printable(repr(ev['checkpoint']), 80)}")
    at = re.search(r"\(([\d.]+)\)", ev["primary"]["decoding"])
    if at and float(at.group(1)) != shared["temperature"]:
        raise ProtocolError(f"{source}: evaluation.primary.decoding: temperature {at.group(1)} is not "
                            f"shared.temperature {shared['temperature']}")
    if ev["primary"]["draws"] != 1:
        raise ProtocolError(f"{source}: evaluation.primary.draws: the grid evaluates draw 0 only (1), got "
                            f"{ev['primary']['draws']}")
    if ev["paper_protocol"]["answers_per_task"] != 1:
        raise ProtocolError(f"{source}: evaluation.paper_protocol.answers_per_task: greedy decoding gives one "
                            "answer per task (1)")
    reps = re.search(r"([\d,]+) replicates", doc["intervals"])
    level = re.search(r"(\d+(?:\.\d+)?)% ", doc["intervals"])
    if not reps or not level:
        raise ProtocolError(f"{source}: intervals: must state 'N% …' and 'N replicates'")
    decodings = (Decoding("primary", ev["primary"]["answers_per_task"], None, False),
                 Decoding("paper", 1, 0.0, True))
    return Protocol(
        source=source, config=t["config"], task=t["task"], split_seed=t["split_seed"],
        sizes={"train": t["train_pool_tasks"], "test": t["test_tasks"], "calibration": t["calibration_tasks"]},
        seeds=list(doc["seeds"]), iterations=shared["iterations"],
        shared=[_override(SHARED_FIELDS[k], v) for k, v in _flat(shared).items()],
        methods={m: [_override(METHOD_FIELDS[k], v) for k, v in s.items() if v != EQUAL_TOKEN]
                 for m, s in methods.items()},
        equal_token=[m for m, s in methods.items() if s["num_generations_answer"] == EQUAL_TOKEN],
        decodings=decodings, n_resamples=int(reps.group(1).replace(",", "")), level=float(level.group(1)) / 100,
        raw=doc)


# ----------------------------------------------------------------------------------------------- the split
@dataclass
class Split:
    """The fixed split: task lists in the task's own problem type."""

    train: list[Any]
    test: list[Any]
    calibration: list[Any]

    def parts(self) -> dict[str, list[Any]]:
        return {"train": self.train, "test": self.test, "calibration": self.calibration}


def build_split(protocol: Protocol, cfg) -> Split:
    """The split of ``protocol`` (see the module docstring), with ``cfg``'s task and generation settings.
    Deterministic in ``split_seed`` and the settings; no training seed enters."""
    from rlcr.runs.task_sets import held_out_set
    from rlcr.seeds import mix

    def draw(part: str, exclude: Sequence[Any], stratified: bool) -> list[Any]:
        view = cfg.model_copy(update={"tasks.eval_file": None, "tasks.num_eval": protocol.sizes[part],
                                      "tasks.eval_seed": mix(protocol.split_seed, SPLIT_SALTS[part]),
                                      "tasks.eval_stratify_counts": stratified})
        return held_out_set(view, exclude)

    train = draw("train", [], False)
    test = draw("test", train, True)
    return Split(train, test, draw("calibration", [*train, *test], True))


def check_disjoint(split: Split, warm_starts: Mapping[int, Sequence[Any]], task) -> None:
    """The protocol's rule by task identity (``task.identity``): the test and calibration splits share no task
    with each other or with the training pool, no part repeats a task, and each seed's warm-start tasks
    (``warm_starts``: seed → tasks) are training tasks. Raises :class:`SplitError` naming the first breach."""
    ids = {k: [task.identity(t) for t in v] for k, v in split.parts().items()}
    for k, v in ids.items():
        if len(set(v)) != len(v):
            raise SplitError(f"the {k} split repeats a task ({len(v) - len(set(v))} repeats)")
    for a, b in (("test", "calibration"), ("test", "train"), ("calibration", "train")):
        both = set(ids[a]) & set(ids[b])
        if both:
            raise SplitError(f"the {a} and {b} splits share {len(both)} task(s), e.g. {printable(sorted(both)[0], 80)}"
                             ": the grid stops before any training")
    pool, held = set(ids["train"]), set(ids["test"]) | set(ids["calibration"])
    for seed, tasks in sorted(warm_starts.items()):
        keys = {task.identity(t) for t in tasks}
        if keys & held or not keys <= pool:
            raise SplitError(f"seed {seed}: {len(keys - pool)} warm-start task(s) outside the training pool "
                             f"({len(keys & held)} of them test or calibration tasks): the grid stops before any "
                             "training")


def split_files(directory: Path) -> dict[str, Path]:
    """Where the split's task files go (JSONL, the task's own loader format)."""
    return {k: directory / f"{k}.jsonl" for k in SPLIT_SALTS}


def write_split(split: Split, directory: Path, task) -> dict[str, Path]:
    """The split as task files under ``directory`` (``train.jsonl``, ``test.jsonl``, ``calibration.jsonl``: one
    ``task.to_record`` row a line). Files already there must hold this very split (else :class:`SplitError`:
    the store was made with another protocol); they are then left as they are."""
    files = split_files(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for part, tasks in split.parts().items():
        text = "".join(json.dumps(task.to_record(t), sort_keys=True) + "\n" for t in tasks)
        path = files[part]
        if path.exists():
            if path.stat().st_size != len(text.encode()) or path.read_text() != text:
                raise SplitError(f"{printable(path)} holds another {part} split than the protocol's: a store "
                                 "belongs to one protocol; use another --store")
            continue
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return files


# ----------------------------------------------------------------------------------------------- the addendum
ADDENDUM_GOALS = ("within_stratum_auroc", "recalibrated_brier", "brier_skill", "accuracy_non_inferior",
                  "out_of_domain_ece", "out_of_domain_ece_qa")
"""The decision rules of bench/protocol-2.yaml (issue 51), each read on both intervals (bootstrap, seed level);
the last one since its amendment 1."""
OUT_OF_DOMAIN = {"math": "math", "question_answering": "qa"}
"""The addendum's out-of-domain sets, each by the task it is evaluated as (also its records' split name)."""
ADDENDUM_POLICIES = ("warm_start", "rlcr", "rlvr", "rlvr_g4")
ADDENDUM_DATA = Path(__file__).resolve().parents[1] / "rlcr" / "tasks" / "data"


def _one_of(*allowed: str) -> Callable[[Any], Any]:
    def check(v: Any) -> Any:
        if v not in allowed:
            raise TypeError(f"must be one of {', '.join(allowed)}, got {v!r}")
        return v
    return check


def _policies(v: Any) -> Any:
    if not isinstance(v, list) or not v or any(p not in ADDENDUM_POLICIES for p in v) or len(set(v)) != len(v):
        raise TypeError(f"must be a list of distinct policies out of {', '.join(ADDENDUM_POLICIES)}, got {v!r}")
    return v


def _data_files(v: Any) -> Any:
    if not isinstance(v, list) or not v or any(not isinstance(f, str) for f in v):
        raise TypeError(f"must be a non-empty list of paths, got {v!r}")
    for f in v:
        path = ADDENDUM_DATA.parents[2] / f
        if path.parent != ADDENDUM_DATA or path.suffix != ".jsonl" or not path.is_file():
            raise TypeError(f"{printable(f, 80)} is not a shipped data set (rlcr/tasks/data/*.jsonl)")
    return v


def _amendments(v: Any) -> Any:
    spec = {"date": _date, "what": _text, "seen_before": _text, "runs": _text}
    if not isinstance(v, list) or not v:
        raise TypeError(f"must be a non-empty list of dated amendments, got {printable(repr(v), 80)}")
    out = []
    for i, a in enumerate(v, 1):
        if not isinstance(a, dict) or set(a) != set(spec):
            raise TypeError(f"amendment {i}: must have exactly the fields {', '.join(spec)}")
        try:
            out.append({k: check(a[k]) for k, check in spec.items()})
        except TypeError as e:
            raise TypeError(f"amendment {i}: {e}") from None
    dates = [a["date"] for a in out]
    if dates != sorted(dates):
        raise TypeError(f"the amendments must be in date order, got {', '.join(dates)}")
    return out


def _ood_set(task: str) -> dict[str, Any]:
    return {"task": _one_of(task), "files": _data_files, "decoding": _starts("sampling"),
            "answers_per_task": _int(1), "max_prompt_tokens": _int(16), "policies": _policies,
            "seeds": _one_of("all"), "unparsed_confidence": _starts("excluded")}


ADDENDUM_OPTIONAL = frozenset({"registered", *(f"out_of_domain.{k}.max_prompt_tokens" for k in OUT_OF_DOMAIN)})
"""Fields the addendum may leave out: an out-of-domain set's ``max_prompt_tokens`` (amendment 2; absent: the
policy's ``rollout.max_prompt_tokens``)."""


ADDENDUM_SPEC: dict[str, Any] = {
    "version": _int(2), "registered": _date, "amends": _text,
    "seeds": {"previous": _seeds, "new": _seeds},
    "runs": {p: _one_of("new", "all") for p in ADDENDUM_POLICIES},
    "methods": {"rlvr_g4": {"num_generations_answer": _int(2), "lambda_conf": _number}},
    "baselines": {"stratum_recalibrated_rlvr": _text, "stratum_isotonic_rlvr": _text},
    "out_of_domain": {k: _ood_set(task) for k, task in OUT_OF_DOMAIN.items()},
    "seed_level_test": _text, "goals": {g: _text for g in ADDENDUM_GOALS}, "decision": _text,
    "amendments": _amendments,
}


@dataclass(frozen=True)
class Addendum:
    """What bench/protocol-2.yaml adds to its base protocol, in the terms the grid runs it in."""

    source: str
    base: Protocol
    seeds: list[int]
    """Every seed the addendum's rules read: the base's, then the new ones."""
    new_seeds: list[int]
    runs: dict[str, list[int]]
    """Per policy, the seeds it is trained (the warm-start: made) and evaluated on."""
    methods: dict[str, list[str]]
    """``rlvr_g4``'s overrides: rlvr's own, its answer group size and λ_conf."""
    out_of_domain: dict[str, Any]
    level: float
    raw: dict[str, Any] = field(repr=False, default_factory=dict)


def load_addendum(path: str | Path, base: str | Path | None = None) -> Addendum:
    """The addendum at ``path``, checked like :func:`load_protocol` (one-line :class:`ProtocolError` naming the
    field), and against its base protocol (``amends``, relative to the repository root, unless ``base``):
    the previous seeds are the base's, the new ones fresh, rlvr_g4's group size is rlcr's."""
    from rlcr.config.loading import ConfigError, read_config_text, safe_yaml

    source = printable(path)
    try:
        doc = _check(safe_yaml(read_config_text(path), source), ADDENDUM_SPEC, "", source, ADDENDUM_OPTIONAL)
    except ConfigError as e:
        raise ProtocolError(str(e)) from None
    protocol = load_protocol(base or ADDENDUM_DATA.parents[2] / doc["amends"])
    seeds = doc["seeds"]
    if seeds["previous"] != protocol.seeds:
        raise ProtocolError(f"{source}: seeds.previous: must be the base protocol's seeds {protocol.seeds}, got "
                            f"{seeds['previous']}")
    if set(seeds["new"]) & set(seeds["previous"]):
        raise ProtocolError(f"{source}: seeds.new: must be fresh seeds, not the base's {seeds['previous']}")
    g_a = int(protocol.raw["methods"]["rlcr"]["num_generations_answer"])
    if doc["methods"]["rlvr_g4"]["num_generations_answer"] != g_a:
        raise ProtocolError(f"{source}: methods.rlvr_g4.num_generations_answer: must be rlcr's answer group size "
                            f"({g_a}), got {doc['methods']['rlvr_g4']['num_generations_answer']}")
    every = [*seeds["previous"], *seeds["new"]]
    own = [_override(METHOD_FIELDS[k], v) for k, v in doc["methods"]["rlvr_g4"].items()]
    fields = {o.split("=", 1)[0] for o in own}
    return Addendum(
        source=source, base=protocol, seeds=every, new_seeds=list(seeds["new"]),
        runs={p: list(seeds["new"]) if w == "new" else every for p, w in doc["runs"].items()},
        methods={"rlvr_g4": [*(o for o in protocol.methods["rlvr"] if o.split("=", 1)[0] not in fields), *own]},
        out_of_domain=doc["out_of_domain"], level=protocol.level, raw=doc)
