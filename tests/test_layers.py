"""The layers point one way: the import graph of `rlcr/` has no cycle, the math modules import no
Ray/vLLM/Prefect, and nothing in `rlcr/` but the CLI (the top edge, which runs the flows) imports `flows/`."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MATH = ["rlcr.rewards", "rlcr.masks", "rlcr.advantages", "rlcr.loss", "rlcr.metrics", "rlcr.tasks.countdown"]


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


def graph() -> dict[str, set[str]]:
    files = {module_name(p): p for d in ("rlcr", "flows") for p in (ROOT / d).rglob("*.py")}
    return {m: {i for i in imports_of(p) if i in files} for m, p in files.items()}


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


def test_math_modules_import_no_ray_vllm_or_prefect():
    for m in MATH:
        path = ROOT / (m.replace(".", "/") + ".py")
        heavy = sorted(i for i in imports_of(path) if i.split(".")[0] in {"ray", "vllm", "prefect"})
        assert heavy == [], f"{m} imports {heavy}"


# A run's paths (``runs/<run_id>/…``) are built by its layout alone (rlcr/run_layout.py, rlcr/runs.py): a path
# literal anywhere else in rlcr/ or flows/ is a second owner of the layout.
RUN_PATH = ("runs/", "iter-", "attempt-", "checkpoint", "rollouts", "probes", "manifest.json", "pending.json",
            "baseline.json", "eval.parquet", "metrics.json", "lease.json", "config.json")
LAYOUT_OWNERS = {"rlcr/run_layout.py", "rlcr/runs.py"}
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
    assert offenders == [], "run paths built outside rlcr/run_layout.py:\n" + "\n".join(offenders)


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
