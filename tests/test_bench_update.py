"""bench/perf/update.py's device/dtype options on CPU at a tiny size (the GPU path is measured by hand, see
docs/update-performance.md "On a GPU (H100)")."""

import sys

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


def test_bf16_runs_on_cpu_side_by_side_with_fp32(monkeypatch, capsys):
    """``--dtypes fp32,bf16`` on CPU: the update under ``update.autocast`` off and bfloat16, checked against each
    other first; the last line is the bf16/fp32 speed ratio."""
    _main(monkeypatch, [*TINY, "--dtypes", "fp32,bf16", "--settings", "new", "--check"])
    out = capsys.readouterr().out
    assert "update dtypes fp32,bf16, CPU bf16 instructions" in out
    assert "check bf16 vs fp32: loss rel diff" in out and "new/bf16" in out.split("round 1/1", 1)[1]
    assert out.strip().splitlines()[-1].startswith("update bf16/fp32 speed: ")


def test_each_dtype_is_the_updates_own_setting():
    bench = _bench()
    assert bench.dtype_config({}, "fp32").update.autocast == "off"
    assert bench.dtype_config({}, "bf16").update.autocast == "bfloat16"


def test_the_lora_setting_runs_beside_full_fine_tuning(monkeypatch, capsys):
    _main(monkeypatch, [*TINY, "--device", "cpu", "--settings", "new", "--lora", "--lora-rank", "4"])
    out = capsys.readouterr().out
    assert "lora: rank 4" in out and "trainable parameters (adapters) in AdamW" in out
    assert "lora" in out.split("round 1/1", 1)[1]
    assert out.strip().splitlines()[-1].startswith("update/matmul GFLOP/s: ")
