"""The layers point one way. rlcr's folders stand on floors (:data:`FLOORS`, the rule in docs/architecture.md): a
module imports only from its own folder, from folders on lower floors, or from a folder on its own floor where no
circle closes; the same holds between the folders of ``bench/``. The import graph of ``rlcr/`` has no cycle even
between modules, the method's formulas import no Ray, vLLM, Prefect or storage, and nothing in ``rlcr/`` but the
CLI imports ``flows/``."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FLOORS: list[tuple[str, ...]] = [
    ("ground",),                        # rlcr/*.py: untrusted, columnar, seeds, events (import only each other)
    ("storage", "tasks", "tracking"),   # bytes at rest; kinds of problems; experiment tracking
    ("config", "core"),                 # settings; the method's formulas
    ("runs",),                          # a run's life: store, paths, lease, references, task sets, cluster
    ("models", "ui"),                   # weights and chat rendering; what a person reads
    ("rollout",),                       # the generation stages (Ray Data + vLLM)
    ("train", "evaluation", "probe"),   # the update and the warm-start; held-out evaluation; the probe
    ("flows",),                         # the Prefect flows
    ("cli",),                           # the `rlcr` command
    ("bench",),                         # benchmarks and the study
]
"""rlcr's folders (``ground``: the modules at the top of ``rlcr/``), from the ground up; the only list of them."""
FLOOR = {room: i for i, rooms in enumerate(FLOORS) for room in rooms}
GROUND = {"rlcr", "rlcr.untrusted", "rlcr.columnar", "rlcr.seeds", "rlcr.events"}
"""The handful of helpers at the top of ``rlcr/``; a new top-level module must find a folder instead."""
MATH = ["rlcr.tasks.countdown", *sorted(f"rlcr.core.{p.stem}" for p in (ROOT / "rlcr" / "core").glob("*.py")
                                        if p.stem != "__init__")]
"""The formulas (all of ``rlcr/core/``) and Countdown's scoring: no Ray, vLLM, Prefect or storage."""
HEAVY = {"ray", "vllm", "prefect", "fsspec", "s3fs", "boto3", "botocore"}


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Every module imported anywhere in the file (top level and inside functions)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def graph(dirs=("rlcr", "flows")) -> dict[str, set[str]]:
    files = {module_name(p): p for d in dirs for p in (ROOT / d).rglob("*.py")}
    return {m: {i for i in imports_of(p) if i in files} for m, p in files.items()}


def room(module: str) -> str:
    """The folder a module lives in: ``ground`` for rlcr's top-level helpers, rlcr's subfolder, ``flows``,
    ``bench`` (or ``bench.<subfolder>``)."""
    parts = module.split(".")
    if parts[0] == "flows":
        return parts[0]
    if parts[0] == "bench":
        return "bench"
    if module in GROUND:
        return "ground"
    return parts[1] if len(parts) > 1 and (ROOT / "rlcr" / parts[1]).is_dir() else "?"


def floor_violations(g: dict[str, set[str]]) -> list[str]:
    """Imports that go up a floor, and circles between folders (same floor), in the graph ``g``."""
    bad = [f"{m} ({room(m)}) imports {d} ({room(d)}), a higher floor" for m, deps in sorted(g.items())
           for d in sorted(deps) if room(m) != room(d) and FLOOR[room(d)] > FLOOR[room(m)]]
    rooms: dict[str, set[str]] = {}
    for m, deps in g.items():
        rooms.setdefault(room(m), set()).update(room(d) for d in deps if room(d) != room(m))
    return bad + [f"folders in a circle: {' -> '.join(c)}" for c in cycles(rooms)]


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected part of ``g`` that has one (an empty list: ``g`` is acyclic)."""
    found, state, stack = [], {}, []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for d in sorted(g.get(n, ())):
            if state.get(d) == 1:
                found.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[n] = 2

    for n in sorted(g):
        if n not in state:
            visit(n)
    return found


def test_every_module_has_a_folder_with_a_floor():
    """Every module of rlcr/ is in a folder on a floor, or one of the few ground helpers."""
    lost = sorted(m for m in graph() if room(m) not in FLOOR)
    assert lost == [], f"modules outside every folder of FLOORS (give them one; see docs/architecture.md): {lost}"


def test_no_import_goes_up_a_floor_or_closes_a_circle_between_folders():
    bad = floor_violations(graph(("rlcr", "flows", "bench")))
    assert bad == [], "\n".join(bad)


def test_bench_modules_import_in_no_circle():
    """bench/'s modules (the study's CLI, its runners and tables, the performance scripts) form no import circle."""
    g = {m: {d for d in deps if d.startswith("bench")} for m, deps in graph(("bench",)).items()}
    assert cycles(g) == []


def test_the_floor_rule_sees_an_import_up_and_a_circle():
    """The rule's own check, on a made-up graph: core importing runs goes up; models ⇄ ui closes a circle."""
    g = {"rlcr.core.loss": {"rlcr.runs.store"}, "rlcr.models.chat": {"rlcr.ui.presentation"},
         "rlcr.ui.presentation": {"rlcr.models.chat"}, "rlcr.runs.store": set()}
    bad = floor_violations(g)
    assert any("rlcr.core.loss (core) imports rlcr.runs.store (runs)" in b for b in bad)
    assert any("folders in a circle" in b and "models" in b and "ui" in b for b in bad)


def test_docs_architecture_lists_the_same_floors():
    """docs/architecture.md's floor list is this one (one line per floor, lowest first)."""
    text = (ROOT / "docs" / "architecture.md").read_text().split("## The floors", 1)[1].split("\n## ", 1)[0]
    listed = [tuple(re.findall(r"`([a-z]+)/?`", line.split("—")[0]))
              for line in text.splitlines() if re.match(r"^\d+\. ", line)]
    assert [f for f in listed if f] == [f for f in FLOORS if f != ("ground",)]


def test_no_import_cycles_in_rlcr():
    g = {m: {i for i in deps if i.startswith("rlcr")} for m, deps in graph().items() if m.startswith("rlcr")}
    # a package's __init__ re-exporting its submodules is not a cycle of the layers
    g = {m: {i for i in deps if not (m.startswith(i + ".") and g.get(i) is not None)} for m, deps in g.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(g.get(m, ())):
            if state.get(d) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(d):] + [d]))
            if d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m)


def test_only_the_cli_imports_flows():
    offenders = sorted(m for m, deps in graph().items()
                       if m.startswith("rlcr") and m.split(".")[:2] != ["rlcr", "cli"]
                       and any(d.startswith("flows") for d in deps))
    assert offenders == []


@pytest.mark.parametrize("module", MATH)
def test_the_formulas_import_no_ray_vllm_prefect_or_storage(module):
    """The formulas (rlcr/core/) import no Ray, vLLM, Prefect or storage; Countdown's scoring no Ray, vLLM or
    Prefect (its file loader reads through fsspec)."""
    path = ROOT / (module.replace(".", "/") + ".py")
    banned = HEAVY if module.startswith("rlcr.core.") else {"ray", "vllm", "prefect"}
    heavy = sorted(i for i in imports_of(path) if i.split(".")[0] in banned or (
        module.startswith("rlcr.core.") and i.startswith("rlcr.storage")))
    assert heavy == [], f"{module} imports {heavy}"


# A run's paths (``runs/<run_id>/…``) are built by its layout alone (rlcr/runs/layout.py, rlcr/runs/store.py): a path
# literal anywhere else in rlcr/ or flows/ is a second owner of the layout.
RUN_PATH = ("runs/", "iter-", "attempt-", "checkpoint", "rollouts", "probes", "manifest.json", "pending.json",
            "baseline.json", "eval.parquet", "metrics.json", "lease.json", "config.json")
LAYOUT_OWNERS = {"rlcr/runs/layout.py", "rlcr/runs/store.py"}
NOT_RUN_PATHS = {("rlcr/tracking/__init__.py", "/runs/"): "an MLflow UI address (…/#/experiments/<id>/runs/<id>)"}
AWAITING_MERGE: set[tuple[str, str]] = set()
"""(file, function) pairs exempt from the run-path rule while a branch moves them to RunLayout: none now."""


def _path_pieces(path: Path):
    """(function name, literal text) of every f-string and every ``"runs"`` argument in the file: where a path
    is put together (docstrings and plain messages are constants, not f-strings, and are not looked at)."""
    tree = ast.parse(path.read_text())
    owner: dict[int, str] = {}
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                owner[id(node)] = fn.name  # ast.walk goes outside in: the innermost function is the owner
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "{}".join(v.value for v in node.values if isinstance(v, ast.Constant))
            yield owner.get(id(node), "<module>"), text
        elif isinstance(node, ast.Call):
            for arg in node.args:
                if isinstance(arg, ast.Constant) and arg.value == "runs":
                    yield owner.get(id(node), "<module>"), "runs/"


def _builds_run_path(text: str) -> str | None:
    import re

    if re.search(r"(^|/)runs/", text):
        return "runs/"
    if re.search(r"(^|/)iter-\{", text) or re.search(r"(^|/)attempt-\{", text):
        return "iter-/attempt-"
    if re.search(r"\}/(checkpoint|rollouts|probes|manifest\.json|pending\.json|metrics\.json|eval\.parquet)\b", text):
        return "a run's artifact"
    return None


def test_only_the_run_layout_builds_run_paths():
    offenders = []
    for d in ("rlcr", "flows"):
        for path in sorted((ROOT / d).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if rel in LAYOUT_OWNERS:
                continue
            for fn, text in _path_pieces(path):
                what = _builds_run_path(text)
                if what and (rel, fn) not in AWAITING_MERGE and not any(
                        rel == f and piece in text for f, piece in NOT_RUN_PATHS):
                    offenders.append(f"{rel}::{fn}: {text!r}")
    assert offenders == [], "run paths built outside rlcr/runs/layout.py:\n" + "\n".join(offenders)


def test_the_run_path_check_sees_a_path_built_by_hand():
    for text in ("runs/{}/iter-{}/checkpoint", "{}/iter-{}", "{}/checkpoint", "{}/runs/{}", "{}/probes/{}"):
        assert _builds_run_path(text), text
    for text in ("rlcr-{}-iter-{}", "run {} has no committed iteration", "probe/{}", "{}/report.json"):
        assert _builds_run_path(text) is None, text


TASK_MODULES = ("rlcr.tasks.countdown", "rlcr.tasks.math")
"""The modules of the tasks shipped with rlcr (and their submodules, ``rlcr.tasks.countdown_sft`` …): only
``rlcr/tasks/`` imports them; the rest of rlcr and the flows go through ``rlcr.tasks.registry.get_task``."""


def test_only_the_tasks_package_imports_a_task_module():
    """Issue 32: generic code reaches a task by name (``get_task(cfg.tasks.name)``), never by importing its module."""
    offenders = sorted(f"{m} imports {d}" for m, deps in graph().items()
                       if not m.startswith("rlcr.tasks.")
                       for d in deps if d.startswith(TASK_MODULES))
    assert offenders == []


def test_the_task_import_rule_sees_an_offending_import(tmp_path):
    """The rule's own check: the AST walk finds an import of a task module inside a function."""
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from rlcr.tasks.countdown_sft import sft_examples\n    import rlcr.tasks.math\n")
    assert {"rlcr.tasks.countdown_sft", "rlcr.tasks.math"} <= {i for i in imports_of(source)
                                                              if i.startswith(TASK_MODULES)}


def test_no_private_name_is_imported_across_modules():
    """A name with a leading underscore stays in its module (rlcr/, flows/, bench/): a split that needs one is not
    done (publish the name, or merge the modules)."""
    private = []
    for d in ("rlcr", "flows", "bench"):
        for path in sorted((ROOT / d).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in (
                        "rlcr", "flows", "bench"):
                    private += [f"{path.relative_to(ROOT)}:{node.lineno} {node.module}.{a.name}" for a in node.names
                                if a.name.startswith("_") and not a.name.startswith("__")]
    assert private == [], "private names imported:\n" + "\n".join(private)
