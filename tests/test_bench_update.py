"""bench/perf/update.py's device/dtype options on CPU at a tiny size (the GPU path is measured by hand, see
docs/update-performance.md "On a GPU (H100)")."""

import sys

import pytest

from conftest import load_bench

TINY = ["--model", "tiny", "--prompts", "1", "--ga", "2", "--gc", "1", "--prompt-len", "20", "--answer-len", "10",
        "--query-len", "5", "--confidence-len", "4", "--repeats", "1", "--matmul-n", "64"]


def _bench():
    return load_bench("update")


def _main(monkeypatch, args):
    monkeypatch.setattr(sys, "argv", ["bench/perf/update.py", *args])
    _bench().main()


def test_cpu_path_with_the_new_flags(monkeypatch, capsys):
    _main(monkeypatch, [*TINY, "--device", "cpu", "--dtypes", "fp32", "--settings", "old,new", "--check"])
    out = capsys.readouterr().out
    assert "fp32 weights on cpu" in out
    assert "weights finite after the step: True" in out
    assert "round 1/1: matmul fp32" in out
    assert out.strip().splitlines()[-1].startswith("update/matmul GFLOP/s: ")


def test_bf16_is_refused_on_cpu(monkeypatch):
    with pytest.raises(SystemExit):
        _main(monkeypatch, [*TINY, "--dtypes", "fp32,bf16"])


def test_autocast_off_restores_the_update():
    bench = _bench()
    import rlcr.train.update as update

    saved = update._autocast
    with bench.autocast_off():
        assert update._autocast is not saved
    assert update._autocast is saved


def test_the_lora_setting_runs_beside_full_fine_tuning(monkeypatch, capsys):
    _main(monkeypatch, [*TINY, "--device", "cpu", "--settings", "new", "--lora", "--lora-rank", "4"])
    out = capsys.readouterr().out
    assert "lora: rank 4" in out and "trainable parameters (adapters) in AdamW" in out
    assert "lora" in out.split("round 1/1", 1)[1]
    assert out.strip().splitlines()[-1].startswith("update/matmul GFLOP/s: ")
