"""Hostile model files (issue items 8 and 9): a chat template cannot hang a run or fill the memory, and errors
about a model's files stay one clean line — a deeply nested tokenizer_config.json, a link to a special file, a
file name holding a newline and an ESC byte. Time bounds here are generous guards, not speed goals."""

import json
import os
import shutil
import time

import pytest
from typer.testing import CliRunner

from rlcr.cli import app
from rlcr.models.chat import render_prompt
from rlcr.models.source import ModelSourceError, check_model
from rlcr.storage import COMPLETE_MARKER, InvalidSeal, StorageError, Store
from rlcr.storage.seals import checkpoint_content_id, read_bounded, sealable_files
from rlcr.untrusted import InvalidInput

CONVERSATIONS = (
    [{"role": "system", "content": "You solve puzzles."}, {"role": "user", "content": "Make 24 from 3 4 6 1."}],
    [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"},
     {"role": "user", "content": "How confident are you?"}],
)
NESTED_LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
RAW = ("\x1b", "\x07", "\u202e")


def one_clean_line(text: str, *needles: str) -> str:
    assert text.count("\n") <= 1 and text.strip(), text[-3000:]
    assert not any(c in text for c in RAW) and "Traceback" not in text, text[-3000:]
    for needle in needles:
        assert needle in text, text
    return text


def cli(*args: str):
    res = CliRunner().invoke(app, list(args))
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert res.exit_code == 2, res.output[-3000:]
    return one_clean_line(res.output)


@pytest.fixture
def plain_model(tiny_model_dir, tmp_path, monkeypatch):
    """The tiny model as a user would have it: a plain directory, its template in chat_template.jinja."""
    monkeypatch.setenv("RLCR_CACHE", str(tmp_path / "cache"))  # digests of an import stay in the test's folder
    d = tmp_path / "my-model"
    shutil.copytree(tiny_model_dir, d, ignore=shutil.ignore_patterns(COMPLETE_MARKER))
    assert (d / "chat_template.jinja").is_file()
    return d


# ======================================================================= item 8: a template cannot hang a run
@pytest.mark.parametrize("template, needle", [
    (NESTED_LOOPS, "steps"),
    ("{% set xs = range(3000)|list %}{% for i in xs %}{% for j in xs %}{% endfor %}{% endfor %}", "steps"),
    ("{% for i in range(30000) %}{{ 'x' * 100 }}{% endfor %}", "renders more than"),
    ("{{ 'x' * 10**10 }}", "repeats a value"),
    ("{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "joins"),
    ("{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}", "builds"),
    ("{{ 'x'|center(10**9) }}", "passes a number"),
    ("{{ '{:>999999999}'.format(1) }}", "width"),
    ("{{ '%999999999d' % 1 }}", "width"),
    ("{% set s = 'x' * 100000 %}{{ s.replace('', s) }}", "replace would build"),
    ("{% set s = 'x' * 100000 %}{{ ([s] * 100000)|join }}", "join would build"),
    ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "recurses"),
    ("{% for i in range(3) recursive %}{{ loop(range(100000)) }}{% endfor %}", "recurses"),
])
def test_a_template_over_the_bounds_is_refused_quickly(template, needle):
    from rlcr.models.template import SAMPLE_CONVERSATIONS, TemplateRefused, render_chat

    t0 = time.perf_counter()
    with pytest.raises(TemplateRefused, match=needle):
        render_chat(template, SAMPLE_CONVERSATIONS[0])
    assert time.perf_counter() - t0 < 30


def test_the_bounded_renderer_renders_real_templates_as_transformers_does(any_tokenizer):
    for messages in CONVERSATIONS:
        expected = any_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert render_prompt(any_tokenizer, messages)[0] == expected


def test_a_model_whose_template_loops_is_refused_at_the_check_naming_the_model(plain_model, tmp_path):
    (plain_model / "chat_template.jinja").write_text(NESTED_LOOPS)
    t0 = time.perf_counter()
    with pytest.raises(ModelSourceError) as e:
        check_model(str(plain_model))
    assert time.perf_counter() - t0 < 60
    one_clean_line(str(e.value), str(plain_model), "chat template", "steps")
    with pytest.raises(ModelSourceError, match="chat template takes more than"):  # the config's template too
        check_model(str(plain_model), chat_template="{% for i in range(9999) %}" + NESTED_LOOPS + "{% endfor %}")
    # the command line: one line naming the model, before Ray (the missing task file would be named next)
    out = cli("eval", f"model.name={plain_model}", f"storage.uri={tmp_path / 'store'}",
              f"tasks.eval_file={tmp_path / 'missing.jsonl'}")
    assert "my-model" in out and "chat template takes more than" in out


def test_every_prompt_renders_within_the_bounds_naming_the_model(tiny_tokenizer):
    """A template that passes the check on rlcr's sample conversations but blows up on some prompt's text
    is refused where the prompt is rendered (rollouts, the probe, warm-start rows all render through it)."""
    import copy

    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = ("{% for m in messages %}{% if 'boom' in m.content %}{% for i in range(3000) %}"
                         "{% for j in range(3000) %}{% endfor %}{% endfor %}{% endif %}{{ m.content }}{% endfor %}")
    assert render_prompt(tok, CONVERSATIONS[0])[0].startswith("You solve")
    with pytest.raises(InvalidInput) as e:
        render_prompt(tok, [{"role": "user", "content": "boom"}], where="prompt_id=7")
    one_clean_line(str(e.value), "chat template takes more than", "prompt_id=7")


# ======================================================================= item 9: one clean line about files
def test_a_deeply_nested_tokenizer_config_is_one_line_naming_the_file(plain_model, tmp_path):
    (plain_model / "chat_template.jinja").unlink()
    config = plain_model / "tokenizer_config.json"
    doc = json.loads(config.read_text())
    config.write_text(json.dumps(doc)[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(ModelSourceError) as e:
        check_model(str(plain_model))
    one_clean_line(str(e.value), "tokenizer_config.json", "nested deeper than")
    out = cli("eval", f"model.name={plain_model}", f"storage.uri={tmp_path / 'store'}")
    assert "tokenizer_config.json: nested deeper than" in out


@pytest.mark.parametrize("target", ["/proc/self/pagemap", "/dev/zero", "fifo"])
def test_a_link_to_a_special_file_is_refused_by_name_before_it_is_read(plain_model, tmp_path, target):
    if target == "fifo":
        target = str(tmp_path / "fifo")
        os.mkfifo(target)
    (plain_model / "chat_template.jinja").unlink()
    config = plain_model / "tokenizer_config.json"
    config.unlink()
    config.symlink_to(target)
    with pytest.raises(ModelSourceError) as e:
        check_model(str(plain_model))
    one_clean_line(str(e.value), "tokenizer_config.json", "refusing to read it")
    out = cli("eval", f"model.name={plain_model}", f"storage.uri={tmp_path / 'store'}")
    assert "tokenizer_config.json" in out and "refusing to read it" in out


def test_read_local_reads_only_regular_files_bounded(tmp_path):
    from rlcr.untrusted import read_local

    (tmp_path / "ok").write_bytes(b"12345")
    assert read_local(tmp_path / "ok", 5) == b"12345"
    with pytest.raises(InvalidInput, match="larger than the 4 bytes"):
        read_local(tmp_path / "ok", 4)
    assert read_local(tmp_path / "ok", 4, overflow=True) == b"12345"
    os.mkfifo(tmp_path / "fifo")
    for name, target in [("pm", "/proc/self/pagemap"), ("zero", "/dev/zero"), ("f", tmp_path / "fifo"),
                         ("gone", tmp_path / "nothing")]:
        (tmp_path / name).symlink_to(target)
        with pytest.raises(InvalidInput) as e:
            read_local(tmp_path / name, 100)
        one_clean_line(str(e.value), str(tmp_path / name))


def test_a_seal_linked_to_a_special_file_is_refused_by_name(tmp_path):
    d = tmp_path / "ck"
    d.mkdir()
    (d / COMPLETE_MARKER).symlink_to("/proc/self/pagemap")
    with pytest.raises(InvalidSeal) as e:
        read_bounded(d / COMPLETE_MARKER)
    one_clean_line(str(e.value), COMPLETE_MARKER, "special file")
    with pytest.raises(InvalidSeal, match="special file"):
        checkpoint_content_id(d)
    with pytest.raises(InvalidSeal, match="special file"):
        Store(str(tmp_path)).read_seal("ck")
    with pytest.raises(FileNotFoundError):  # not sealed at all: still "no seal", not an error
        read_bounded(tmp_path / "nothing")


def test_a_file_name_with_a_newline_and_esc_is_shown_escaped_on_one_line(plain_model, tmp_path):
    (plain_model / "notes\n\x1b[2J\x1b]0;pwned\x07.txt").write_text("x")
    with pytest.raises(StorageError) as e:
        sealable_files(plain_model)
    one_clean_line(str(e.value), "cannot be sealed", "my-model")
    assert isinstance(e.value, InvalidInput)  # a refusal of the input: one line on the command line
    with pytest.raises(StorageError):  # nothing is written
        Store(str(tmp_path / "store")).put_dir(plain_model, "models/x")
    assert not (tmp_path / "store" / "models" / "x").exists()
    out = cli("eval", f"model.name={plain_model}", f"storage.uri={tmp_path / 'store'}")  # imported into the store
    assert "cannot be sealed" in out and "notes ?[2J?]0;pwned?.txt" in out
