"""Hostile inputs, continued: duplicate keys are refused (YAML configs, JSONL task rows, JSON documents), and
columnar files (Parquet, ``save_to_disk`` Arrow streams) are read in bounded memory, a decompression bomb refused
in one line naming the file. Peak memory is measured in a fresh subprocess (its size sampled every 2 ms during
the read, and ru_maxrss where the read sets a new peak), against :data:`GROWTH_BOUND_MIB` over its size before
reading."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlcr.columnar import MAX_TABLE_BYTES, TableTooLarge, expanded_bytes, parquet_batches, read_parquet_table
from rlcr.config import ConfigError, RLCRConfig
from rlcr.rollout.records import read_records_table, rollout_schema
from rlcr.storage.seals import parse_seal
from rlcr.tasks.base import TaskFormatError, read_rows
from rlcr.tasks.countdown import load_tasks
from rlcr.untrusted import InvalidInput, parse_json

GROWTH_BOUND_MIB = 300
"""Most a bomb may grow the reading process (MiB over its size before the read); the file's rows would take
terabytes."""
BIG = 10 * 2 ** 20
"""The one long value every row of a dictionary bomb points at (10 MiB)."""


# --------------------------------------------------------------------------- duplicate keys


def test_a_config_section_given_twice_is_refused_naming_key_file_and_lines(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("run: {seed: 7, iterations: 50}\nrun: {id: exp-7}\n")
    with pytest.raises(ConfigError) as e:
        RLCRConfig.from_yaml(path)
    msg = str(e.value)
    assert "\n" not in msg and "exp.yaml" in msg and "duplicate key 'run'" in msg
    assert "first at line 1" in msg and "line 2" in msg


@pytest.mark.parametrize("text, key, line", [
    ("run:\n  seed: 7\n  iterations: 50\n  seed: 8\n", "seed", 4),  # block style, one level down
    ("rollout: {temperature: 1.0, temperature: 0.5}\n", "temperature", 1),  # flow style, one line
    ("run: {id: a}\ntasks:\n  fields: {nums: n, nums: m}\n", "nums", 3),  # two levels down
])
def test_a_key_given_twice_is_refused_at_any_depth(tmp_path, text, key, line):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"c\.yaml: .*duplicate key '{key}'.* line {line}"):
        RLCRConfig.from_yaml(path)


def test_an_override_value_with_a_key_twice_is_refused():
    with pytest.raises(ConfigError, match="duplicate key 'seed'"):
        RLCRConfig.from_yaml(None, ["run={seed: 1, seed: 2}"])


def test_distinct_keys_still_load(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("run: {seed: 7, iterations: 50}\nrollout: {temperature: 0.5}\n")
    cfg = RLCRConfig.from_yaml(path)
    assert (cfg.run.seed, cfg.run.iterations, cfg.rollout.temperature) == (7, 50, 0.5)


@pytest.mark.parametrize("load", [load_tasks, lambda p: list(read_rows(p))], ids=["countdown", "read_rows"])
def test_a_jsonl_task_row_with_a_key_twice_is_refused_naming_key_file_and_row(tmp_path, load):
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"nums": [1, 2, 3], "target": 6}\n{"nums": [1, 2, 3], "target": 6, "target": 7}\n')
    with pytest.raises(TaskFormatError) as e:
        load(str(path))
    msg = str(e.value)
    assert "\n" not in msg and "tasks.jsonl: row 2" in msg and "duplicate key 'target'" in msg


def test_json_documents_refuse_a_key_twice_at_any_depth():
    with pytest.raises(InvalidInput, match=r"^manifest\.json: duplicate key 'b'$"):
        parse_json(b'{"a": {"b": 1, "b": 2}}', "manifest.json")
    with pytest.raises(InvalidInput, match="duplicate key 'a'"):
        parse_json('{"a": 1, "a": 1}', "m.json")
    assert parse_json('{"a": {"b": 1}, "b": [{"a": 2}]}', "m.json") == {"a": {"b": 1}, "b": [{"a": 2}]}
    with pytest.raises(InvalidInput, match="_COMPLETE: duplicate key 'files'"):
        parse_seal(b'{"files": {}, "files": {}}', "_COMPLETE")


# --------------------------------------------------------------------------- bombs


def _zeros(n: int) -> pa.Array:
    return pa.array(np.zeros(n, dtype=np.int32))


def _dictionary_bomb(n: int = 200_000) -> pa.Array:
    """A string column whose every row is one 10 MiB value: a dictionary page and run-length-encoded indices."""
    return pa.DictionaryArray.from_arrays(_zeros(n), pa.array(["x" * BIG]))


def _write(table: pa.Table, path) -> None:
    pq.write_table(table, path, compression="zstd", store_schema=False)  # the file says string, not dictionary


def _task_bomb(path, column: str) -> None:
    n = 200_000
    nums = pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32) * 3), pa.array(np.ones(3 * n, np.int64)))
    _write(pa.table({"nums": nums, "target": pa.array(np.full(n, 3)), column: _dictionary_bomb(n)}), path)


def _records_bomb(path) -> None:
    n = 200_000
    columns = {}
    for f in rollout_schema("countdown"):
        if f.name == "context_text":
            columns[f.name] = _dictionary_bomb(n)
        elif pa.types.is_string(f.type):
            columns[f.name] = pa.DictionaryArray.from_arrays(_zeros(n), pa.array(["answer"]))
        elif pa.types.is_list(f.type):
            columns[f.name] = pa.ListArray.from_arrays(_zeros(n + 1), pa.array([], f.type.value_type))
        else:
            columns[f.name] = pa.array(np.zeros(n)).cast(f.type)
    _write(pa.table(columns), path)


def _rows_bomb(path) -> None:
    _write(pa.table({"nums": pa.nulls(100_000_000), "target": pa.nulls(100_000_000)}), path)


def _stream_bomb(directory) -> None:
    """A save_to_disk directory whose Arrow stream is compressed: 60 messages of one 10 MiB row each (600 MiB)."""
    directory.mkdir()
    batch = pa.record_batch({"question": ["x" * BIG], "answer": ["1"]})
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_stream(str(directory / "data-00000-of-00001.arrow"), batch.schema, options=options) as w:
        for _ in range(60):
            w.write_batch(batch)
    (directory / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))


_CHILD = textwrap.dedent("""
    import json, os, resource, sys, threading, time
    kind, path = sys.argv[1], sys.argv[2]
    from rlcr.evaluation.comparison import read_records
    from rlcr.storage import Store
    from rlcr.tasks.countdown import load_tasks
    from rlcr.tasks.registry import get_task
    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 2 ** 20
    import pyarrow.parquet
    base, peak_before = rss(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    sampled = [base]
    def watchdog():  # samples the size; a reader that does not stop is stopped before it takes the machine's memory
        while True:
            sampled.append(rss())
            if sampled[-1] - base > 3 * {bound}:
                print(json.dumps({{"error": "killed: over the bound", "growth": sampled[-1] - base}}), flush=True)
                os._exit(3)
            time.sleep(0.002)
    threading.Thread(target=watchdog, daemon=True).start()
    try:
        if kind == "countdown":
            load_tasks(path)
        elif kind == "math":
            get_task("math").load(path)
        elif kind == "compare":
            read_records(path)
        elif kind == "store":
            Store(os.path.dirname(path)).read_parquet(os.path.basename(path))
        error = "read without an error"
    except Exception as e:
        error = f"{{type(e).__name__}}: {{e}}"
    peak_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024  # a new peak: set by the read
    growth = max(max(sampled), peak_after if peak_after > peak_before else base) - base
    print(json.dumps({{"error": error, "growth": growth}}))
""").format(bound=GROWTH_BOUND_MIB)


def _read_in_child(kind: str, path) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, kind, str(path)], capture_output=True, text=True, timeout=300)
    assert out.stdout.strip(), out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _refused_in_bounded_memory(result: dict, name: str) -> None:
    assert result["growth"] < GROWTH_BOUND_MIB, result
    assert "\n" not in result["error"] and name in result["error"], result
    assert "decompression bomb" in result["error"], result


@pytest.mark.parametrize("kind, column", [("countdown", "solution"), ("math", "question")])
def test_a_dictionary_bomb_task_file_is_refused_in_bounded_memory(tmp_path, kind, column):
    path = tmp_path / "bomb.parquet"
    _task_bomb(path, column)
    assert path.stat().st_size < 64 * 1024  # a few kB on disk, 2 TB of strings once decoded
    _refused_in_bounded_memory(_read_in_child(kind, path), "bomb.parquet")


@pytest.mark.parametrize("kind", ["countdown", "math"])
def test_a_task_file_of_a_hundred_million_rows_is_refused_from_its_footer(tmp_path, kind):
    path = tmp_path / "rows.parquet"
    _rows_bomb(path)
    result = _read_in_child(kind, path)
    _refused_in_bounded_memory(result, "rows.parquet")
    assert "100,000,000 rows" in result["error"]


def test_a_compressed_save_to_disk_stream_is_refused_in_bounded_memory(tmp_path):
    _stream_bomb(tmp_path / "saved")
    _refused_in_bounded_memory(_read_in_child("math", tmp_path / "saved"), "saved")


@pytest.mark.parametrize("kind", ["compare", "store"])
def test_a_records_bomb_is_refused_in_bounded_memory_by_compare_and_the_store(tmp_path, kind):
    path = tmp_path / "eval.parquet"
    _records_bomb(path)
    _refused_in_bounded_memory(_read_in_child(kind, path), "eval.parquet")


def test_a_highly_compressed_file_is_refused_from_its_footer_before_any_batch(tmp_path):
    path = tmp_path / "zeros.parquet"
    pq.write_table(pa.table({"question": ["0" * 4096] * 1024}), path, compression="zstd", use_dictionary=False)
    assert path.stat().st_size < 64 * 1024
    batches = parquet_batches(str(path), str(path), max_bytes=2 ** 20)
    with pytest.raises(TableTooLarge, match=r"zeros\.parquet: column 'question' .* decompression bomb"):
        next(batches)


def test_files_within_the_limits_read_as_written(tmp_path):
    path = tmp_path / "ok.parquet"
    table = pa.table({"question": pa.array(["a", "bb", None, "a"] * 700).dictionary_encode(),
                      "nums": [[1, 2], [], None, [3]] * 700, "level": [1, 2, 3, 4] * 700})
    pq.write_table(table, path, row_group_size=1000)
    read = read_parquet_table(str(path), "ok.parquet")
    assert read.to_pylist() == table.to_pylist() and MAX_TABLE_BYTES > expanded_bytes(read["question"]) > 0
    assert [row for _, row in read_rows(path)] == table.to_pylist()


def test_expanded_bytes_counts_a_dictionary_value_once_per_row():
    array = pa.DictionaryArray.from_arrays(pa.array([0, 0, 1, 0], pa.int32()), pa.array(["x" * 1000, "y"]))
    assert 3001 <= expanded_bytes(array) <= 3001 + 64
    assert expanded_bytes(pa.array([["ab", "c"]]).cast(pa.list_(pa.dictionary(pa.int32(), pa.string())))) >= 3


def test_records_missing_a_column_are_refused_before_rows_are_read(tmp_path):
    path = tmp_path / "few.parquet"
    pq.write_table(pa.table({"nums": [[1, 2]], "target": [3], "prompt_id": [0]}), path)
    with pytest.raises(InvalidInput, match=r"few\.parquet: field 'run_id' is missing"):
        read_records_table(str(path), str(path))


def test_provenance_with_a_key_twice_is_refused_naming_the_file(tmp_path):
    from rlcr.evaluation.comparison import RowsRefused, read_records
    from rlcr.rollout.records import PROVENANCE_KEY, rows_to_table
    from test_hostile_inputs import eval_rows

    path = tmp_path / "twice.parquet"
    doc = b'{"policy": "runs/a", "method": "rlcr", "policy": "runs/b"}'
    pq.write_table(rows_to_table(eval_rows()).replace_schema_metadata({PROVENANCE_KEY: doc}), path)
    with pytest.raises(RowsRefused, match=r"twice\.parquet: provenance metadata: duplicate key 'policy'"):
        read_records(str(path))
