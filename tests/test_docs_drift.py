"""Issue 48 item 4: docs and help that cannot drift from the code. Every config name, `rlcr` option and
`docs/design.md §N` reference in README.md, docs/, infra/, configs/ and the CLI's help is checked against the
code (the config's fields, the commands' options, design.md's section titles); no flat name of older rlcr is
shown as a setting; the listed drifts stay fixed."""

import re
from pathlib import Path

import pytest
import typer.main

from rlcr.cli import app
from rlcr.config import FLAT_NAMES, RLCRConfig

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "infra" / "README.md",
        *sorted((ROOT / "infra").glob("*.yaml")), *sorted((ROOT / "configs").glob("*.yaml"))]
FIELDS = {name for name, _ in RLCRConfig.dotted_fields()}
SECTIONS = set(RLCRConfig.model_fields)
FILE_SUFFIXES = {"py", "md", "json", "yaml", "parquet", "safetensors", "html", "jsonl", "txt", "pt"}
NOT_CONFIG = {
    "update.prepass_s": "a metric key of an iteration's metrics.json (docs/iteration-overhead.md), not a field",
    "update.train_s": "a metric key of an iteration's metrics.json (docs/iteration-overhead.md), not a field",
}
DOTTED = re.compile(r"(?<![\w./-])(" + "|".join(sorted(SECTIONS)) + r")\.([A-Za-z_][A-Za-z0-9_]*)\b(?![/.]\w)")


def _commands(cmd=None, path=()):
    """(path of words, click command) of every leaf command of `rlcr`."""
    cmd = cmd or typer.main.get_command(app)
    for name, sub in getattr(cmd, "commands", {}).items():
        if getattr(sub, "commands", None):
            yield from _commands(sub, (*path, name))
        else:
            yield (*path, name), sub


COMMANDS = dict(_commands())
ROOT_OPTIONS = {o for p in typer.main.get_command(app).params for o in p.opts}


def options(cmd, secondary: bool = True) -> set[str]:
    """The command's options (``secondary``: with their ``--no-…`` forms)."""
    return {o for p in cmd.params for o in (*p.opts, *(p.secondary_opts if secondary else ()))
            if o.startswith("--")} - {"--help"}


def help_texts():
    """(command words, text) of every help text of the CLI: the group's, each command's and option's."""
    root = typer.main.get_command(app)
    yield (), root.help or ""
    for words, cmd in COMMANDS.items():
        yield words, cmd.help or ""
        for p in cmd.params:
            yield words, getattr(p, "help", None) or ""


def doc_lines():
    for path in DOCS:
        for i, line in enumerate(path.read_text().splitlines(), 1):
            yield f"{path.relative_to(ROOT)}:{i}", line


def test_every_dotted_config_name_is_a_field():
    bad = [f"{where}: {m.group(0)}" for where, text in [*doc_lines(), *((f"help of {w}", t) for w, t in help_texts())]
           for m in DOTTED.finditer(text) if m.group(0) not in FIELDS and m.group(2) not in FILE_SUFFIXES
           and m.group(0) not in NOT_CONFIG]
    assert bad == [], "names that are no config field:\n" + "\n".join(bad)


def _rlcr_segments(text: str):
    """Each `rlcr …` command written in a line: (command words, options named), up to the next `rlcr` or the
    end of its code span."""
    for span in re.findall(r"`([^`]*)`", text) or []:
        for seg in re.split(r"(?=\brlcr )", span):
            if not seg.startswith("rlcr "):
                continue
            words = re.findall(r"^rlcr((?: [a-z][a-z-]*)*)", seg)[0].split()
            for n in (2, 1, 0):
                if tuple(words[:n]) in COMMANDS or n == 0:
                    yield tuple(words[:n]), set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", seg))
                    break


def test_every_documented_option_exists_on_its_command():
    bad = []
    for where, line in doc_lines():
        for words, opts in _rlcr_segments(line):
            known = options(COMMANDS[words]) if words else set()
            bad += [f"{where}: rlcr {' '.join(words)} {o}" for o in opts - known - ROOT_OPTIONS]
    assert bad == [], "options that the command does not have:\n" + "\n".join(bad)


def test_the_readme_command_table_lists_every_command_and_option():
    rows = {}
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("| `rlcr "):
            cell = line.split("|")[1]
            for words, opts in _rlcr_segments(cell):
                rows.setdefault(words, set()).update(opts)
    missing = [" ".join(w) for w in COMMANDS if w not in rows]
    assert missing == [], f"commands without a row in the README's table: {missing}"
    short = {" ".join(w): sorted(options(COMMANDS[w], False) - rows[w]) for w in COMMANDS
             if options(COMMANDS[w], False) - rows[w]}
    assert short == {}, f"options missing from the README's command table: {short}"


SECTION_TITLES = {int(m.group(1)): m.group(2) for m in re.finditer(r"^## §(\d+) (.+)$",
                                                                  (ROOT / "docs/design.md").read_text(), re.M)}
DESIGN_REF = re.compile(r"design\.md\)?\s*§\s*(\d+)((?:\s*(?:,|and|–|-)\s*§?\s*\d+)*)")
HELP_SECTIONS = {("eval",): {13}, ("compare",): {13}, ("probe",): {15}, ("sft",): {14}, ("train",): {12},
                 ("export",): {11}}
"""The design sections each command's help may cite (their titles: evaluation and calibration metrics, the
faithfulness probe, the format warm-start, continuous training)."""


def _refs(text: str) -> list[int]:
    out = []
    for m in DESIGN_REF.finditer(text):
        out += [int(m.group(1)), *map(int, re.findall(r"\d+", m.group(2)))]
    return out


def test_every_design_reference_names_a_section():
    sources = [*doc_lines(), *((f"help of {w}", t) for w, t in help_texts())]
    for py in [*(ROOT / "rlcr").rglob("*.py"), *(ROOT / "flows").glob("*.py")]:
        sources += [(str(py.relative_to(ROOT)), py.read_text())]
    bad = [f"{where}: §{n}" for where, text in sources for n in _refs(text) if n not in SECTION_TITLES]
    assert bad == [], "design.md references to no section:\n" + "\n".join(bad)


def test_the_help_cites_the_sections_of_its_topic():
    bad = [f"{' '.join(w) or 'rlcr'}: §{n} ({SECTION_TITLES.get(n)})" for w, text in help_texts()
           for n in _refs(text) if n not in HELP_SECTIONS.get(w, set())]
    assert bad == [], "help texts citing another topic's design section:\n" + "\n".join(bad)
    assert "Evaluation" in SECTION_TITLES[13] and "probe" in SECTION_TITLES[15] and "SFT" in SECTION_TITLES[14]


FLAT_ALLOWED = {
    ("docs/results.md", "sft_tasks=16 sft_epochs=2 num_eval_tasks=16"): "quotes the command run on an older commit",
    ("docs/results.md", "method:"): "bench/methods.py's `method:field=value` override syntax",
}
"""Flat names a doc quotes on purpose (design.md §18, the SPEC mapping, is allowed as a whole)."""
AMBIGUOUS = {"run_id": "the Prefect flows' parameter and the run's id in a manifest",
             "model": "a section", "method": "a section", "tracking": "a section",
             "iterations": "the flows' parameter", "seed": "vLLM's SamplingParams(seed=…)",
             "temperature": "a word", "retries": "a word", "objective": "a word", "task": "a word"}
"""Bare single words that are flat names and also something else; written as a setting (`task:`, `seed=1`)
they are still refused."""


def test_no_flat_config_name_is_shown_as_a_setting():
    bad = []
    for path in DOCS:
        section = ""
        rel = str(path.relative_to(ROOT))
        for i, line in enumerate(path.read_text().splitlines(), 1):
            section = line if line.startswith("## ") else section
            if rel == "docs/design.md" and section.startswith("## §18"):
                continue
            for span in re.findall(r"`([^`\n]+)`", line):
                if (rel, span) in FLAT_ALLOWED:
                    continue
                for m in re.finditer(r"(?<![\w.\-/({])(?<!, )([a-z][a-z_]*)(=|: |:$|$| )", span):
                    name, after = m.groups()
                    if name in FLAT_NAMES and (after in ("=", ": ", ":") or name not in AMBIGUOUS):
                        bad.append(f"{rel}:{i}: `{span}` (use {FLAT_NAMES[name]})")
    assert bad == [], "flat names of older rlcr shown as settings:\n" + "\n".join(bad)


# ----------------------------------------------------------------------------- the listed drifts
def test_the_listed_drifts_are_fixed():
    tasks = (ROOT / "docs/tasks.md").read_text()
    assert "`task:`" not in tasks and "RLCRConfig.task`" not in tasks and "`tasks.name`" in tasks
    assert "on Countdown" not in (typer.main.get_command(app).help or "")
    assert "sft_" not in COMMANDS[("sft",)].help and "sft.*" in COMMANDS[("sft",)].help
    results = (ROOT / "docs/results.md").read_text()
    assert not re.search(r"iter-\d{4}/checkpoint", results), "results.md names a path a user must guess"
    readme = (ROOT / "README.md").read_text()
    assert "docs/s3.md" in readme and "docs/one-gpu.md" in readme
    s3 = (ROOT / "docs/s3.md").read_text()
    assert "storage.uri" in s3 and "tracking" in s3 and "storage.s3_endpoint_url" in s3


def test_probe_and_eval_tables_name_no_countdown_terms():
    from rlcr.probe import report
    from rlcr.ui.presentation import by_count_text, eval_table

    assert "equation" not in Path(report.__file__).read_text()
    from rich.console import Console

    out = Console(width=200, record=True)
    out.print(eval_table("p", "rlcr", 0, {"by_count": {"Level 3": {"accuracy": 0.5, "auroc": None}}}, stratum="level"))
    text = out.export_text()
    assert "by level" in text and "number" not in text and "Level 3: acc 0.50" in by_count_text(
        {"by_count": {"Level 3": {"accuracy": 0.5, "auroc": None}}})


@pytest.mark.parametrize("name, label", [("countdown", "number count"), ("math", "level")])
def test_each_task_names_its_strata(name, label):
    from rlcr.tasks.registry import get_task

    assert get_task(name).stratum_label == label


# ----------------------------------------------------------------------------- docs that read as the product
def test_the_readme_is_a_short_entry_that_links_every_doc():
    """The README stays on a screen or two (≤ 150 lines) and its documentation table links every file in docs/."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150, f"README.md has {len(readme.splitlines())} lines (at most 150)"
    linked = set(re.findall(r"\]\((?:\.\./)?docs/([\w.-]+\.md)", readme))
    missing = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    missing = [m for m in missing if m not in linked]
    assert missing == [], f"docs the README does not link: {missing}"


def test_docs_cite_no_issue_numbers():
    """README and docs describe the product, not its history: no "issue N" (the history is in git)."""
    cited = [f"{path.relative_to(ROOT)}:{i}: {line.strip()[:80]}" for path in DOCS if path.suffix == ".md"
             for i, line in enumerate(path.read_text().splitlines(), 1)
             if re.search(r"\bissues? \d+|\(#\d+\)", line)]
    assert cited == [], "issue numbers in the docs:\n" + "\n".join(cited)


def test_the_architecture_map_names_paths_that_exist():
    """docs/architecture.md's folder table: every path in it exists (a bare file name is in the folder named before
    it in the same row)."""
    rows = ["".join(line.split("|")[1:3]) for line in (ROOT / "docs/architecture.md").read_text().splitlines()
            if line.startswith("| `")]
    assert len(rows) >= 15
    absent = []
    for cell in rows:
        folder = ""
        for name in re.findall(r"`([\w./*-]+(?:\.py|\.yaml|\.ipynb|\.md|/))`", cell):
            path = name.rstrip("/")
            if name.endswith("/"):
                folder = path
            elif "/" in path:
                folder = path.rsplit("/", 1)[0] if "." in path.rsplit("/", 1)[-1] else path
            else:
                path = f"{folder}/{path}" if folder else path
            if not any((ROOT / p).exists() for p in (path, path.replace("*", ""))) and not list(ROOT.glob(path)):
                absent.append(name)
    assert absent == [], f"paths in docs/architecture.md that do not exist: {absent}"
