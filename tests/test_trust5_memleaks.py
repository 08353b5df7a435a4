"""Trust review, round 5: bounded memory and leaks (Parquet page bombs, abandoned tracker calls, the temporary
Prefect server), YAML merge keys, look-alike field names, unsolvable Countdown options, the Markdown artifact."""

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rlcr.config import ConfigError, RLCRConfig
from rlcr.config.loading import safe_yaml
from rlcr.ui.presentation import metrics_markdown


def _varint(n):
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _zz(n):
    return _varint((n << 1) ^ (n >> 63))


def _struct(*fields):
    out, last = b"", 0
    for fid, (kind, data) in fields:
        out += bytes([((fid - last) << 4) | kind]) + data
        last = fid
    return out + b"\x00"


def _i(v, kind=5):
    return kind, _zz(v)


def _s(*fields):
    return 12, _struct(*fields)


def _bin(b):
    return 8, _varint(len(b)) + b


def _list(kind, items):
    return 9, bytes([(len(items) << 4) | kind]) + b"".join(items)


def _bomb(path, inflated=1 << 30):
    """A Parquet file of one row whose one gzip page inflates to ``inflated`` bytes while its footer says 100."""
    z, chunk, body = zlib.compressobj(1, zlib.DEFLATED, 31), bytes(1 << 20), [(inflated - 4).to_bytes(4, "little")]
    body = [z.compress(body[0])]
    for _ in range((inflated - 4) >> 20):
        body.append(z.compress(chunk))
    body.append(z.compress(bytes((inflated - 4) & ((1 << 20) - 1))) + z.flush())
    data = b"".join(body)
    header = _struct((1, _i(0)), (2, _i(inflated)), (3, _i(len(data))),
                     (5, _s((1, _i(1)), (2, _i(0)), (3, _i(3)), (4, _i(3)))))
    meta = _s((1, _i(6)), (2, _list(5, [_zz(0)])), (3, _list(8, [_bin(b"question")[1]])), (4, _i(2)),
              (5, _i(1, 6)), (6, _i(100, 6)), (7, _i(len(header) + len(data), 6)), (9, _i(4, 6)))
    footer = _struct((1, _i(1)), (2, _list(12, [_struct((4, _bin(b"schema")), (5, _i(1))),
                                                _struct((1, _i(6)), (3, _i(0)), (4, _bin(b"question")))])),
                     (3, _i(1, 6)),
                     (4, _list(12, [_struct((1, _list(12, [_struct((2, _i(4, 6)), (3, meta))])), (2, _i(100, 6)),
                                            (3, _i(1, 6)))])))
    path.write_bytes(b"PAR1" + header + data + footer + len(footer).to_bytes(4, "little") + b"PAR1")


def test_a_parquet_page_bomb_under_a_lying_footer_is_refused_before_it_is_decompressed(tmp_path):
    """Item 14: the footer's sizes were the only check, so a page that declares 1 GiB behind a footer that says
    100 bytes was decompressed (peak RSS over 1 GiB) before the refusal. Now the page headers are added up first."""
    path = tmp_path / "bomb.parquet"
    _bomb(path)
    assert path.stat().st_size < 8 << 20
    code = ("import re, sys\nfrom rlcr.tasks.base import read_rows, TaskFormatError\n"
            "try:\n    list(read_rows(sys.argv[1]))\n    print('READ')\nexcept TaskFormatError as e:\n    print(e)\n"
            "print(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1))\n")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=300)
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 2, out.stdout + out.stderr
    assert "bomb.parquet" in lines[0] and "decompress" in lines[0]
    # VmHWM, not ru_maxrss: the latter survives exec, so a child of a big pytest process would inherit its peak
    assert int(lines[1]) < 600 * 1024, f"peak RSS {int(lines[1]) // 1024} MiB"


def test_parquet_files_with_statistics_v2_pages_and_a_page_index_still_read(tmp_path):
    """Item 14: the page-header walk must read what pyarrow writes (dictionary pages, v2 pages, statistics)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlcr.columnar import read_parquet_table

    table = pa.table({"q": [f"question {i % 7}" for i in range(5000)], "n": list(range(5000)),
                      "l": [[i, i + 1] for i in range(5000)]})
    pq.write_table(table, tmp_path / "t.parquet", compression="zstd", data_page_version="2.0",
                   write_page_index=True, data_page_size=4096)
    assert read_parquet_table(str(tmp_path / "t.parquet"), "t.parquet").to_pylist() == table.to_pylist()


def test_yaml_merge_keys_are_refused():
    """Small: ``<<:`` merged keys were skipped by the duplicate-key rule (``seed`` given twice went unseen)."""
    with pytest.raises(ConfigError, match="merge keys"):
        safe_yaml("run:\n  seed: 1\n  <<: {seed: 2}\n", "c.yaml")


def test_a_lookalike_field_name_names_its_character_and_the_ascii_name():
    """Small: ``sеed`` with a Cyrillic е was refused as "unknown field 'run.sеed'", shown as the look-alike."""
    with pytest.raises(ConfigError) as e:
        RLCRConfig.from_dict({"run": {"s\u0435ed": 3}})
    assert "U+0435 CYRILLIC SMALL LETTER IE" in str(e.value) and "did you mean 'seed'?" in str(e.value)


@pytest.mark.parametrize("target", [[50, 60], [5000, 6000]])
def test_countdown_options_with_no_solvable_task_are_refused_in_seconds(target):
    """Small: options whose numbers reach no target took 1000 draws per task (122 s and more) to be refused."""
    start = time.monotonic()
    with pytest.raises(ConfigError, match="tasks.options.target_range"):
        RLCRConfig.from_dict({"tasks": {"options": {"num_range": [1, 2], "target_range": target}}})
    assert time.monotonic() - start < 30


def test_task_strings_are_escaped_in_the_markdown_artifact():
    """Small: stratum names and URIs went into the Prefect artifact as they were (HTML, links, table cells)."""
    m = {"rollout": {}, "update": {}, "timings": {},
         "eval": {"by_count": {"<img src=x onerror=alert(1)>|[l](javascript:x)": {"accuracy": 0.5, "auroc": None}}}}
    text = metrics_markdown("r1", 1, m, {"checkpoint": "s3://b/`x`<script>"})
    assert "<img" not in text and "<script>" not in text and "](javascript" not in text
    assert "&lt;img" in text and "\\|" in text


class _Endless(BaseHTTPRequestHandler):
    sent = [0]
    closed = threading.Event()

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(10 ** 12))
        self.end_headers()
        try:
            while True:
                self.wfile.write(b" " * 65536)
                self.sent[0] += 65536
                time.sleep(0.01)
        except OSError:
            self.closed.set()

    do_POST = do_GET


def test_an_abandoned_tracker_call_stops_downloading_an_endless_body(tmp_path):
    """Item 14: after "tracking is off" the abandoned call went on downloading the body into memory forever."""
    from rlcr.tracking import open_tracker

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Endless)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        tracker = open_tracker("mlflow", f"http://127.0.0.1:{server.server_address[1]}", str(tmp_path), "r1", {},
                               timeout_s=3)
        assert not tracker.enabled
        assert _Endless.closed.wait(60), f"still downloading: {_Endless.sent[0]:,} bytes sent"
        assert not [t for t in threading.enumerate() if t.name.startswith("rlcr-tracking-")]
    finally:
        server.shutdown()
        server.server_close()


def _prefect_servers_of(parent: int) -> list[int]:
    """The pids of Prefect API servers (uvicorn on Prefect's app) whose parent is ``parent``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(") ", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent and b"prefect.server.api.server" in cmdline:
            found.append(int(entry))
    return found


def test_the_temporary_prefect_server_dies_with_a_sigkilled_rlcr_train(tmp_path, tiny_model_dir):
    """Item 15: Prefect stops its temporary server at exit; a SIGKILLed ``rlcr train`` left it running under
    init, forever. The real command: once its server is up, ``rlcr train`` is SIGKILLed; the server must end."""
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RAY_", "PREFECT_")) and k not in ("RLCR_LOG_DIR", "DO_NOT_TRACK")}
    with tempfile.TemporaryDirectory(prefix="rlcr-k-", dir="/tmp") as tmp:  # short: Ray's socket paths
        env.update(PYTHONPATH=str(root), RAY_TMPDIR=tmp, PREFECT_HOME=str(Path(tmp) / "prefect"),
                   RLCR_RAY_DASHBOARD="0")
        proc = subprocess.Popen([sys.executable, "-m", "rlcr.cli", "train", "--config",
                                 str(root / "configs" / "tiny.yaml"), "--run-id", "killed",
                                 f"model.name={tiny_model_dir}", f"storage.uri={tmp_path / 'store'}"],
                                cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        servers: list[int] = []
        try:
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline and not servers and proc.poll() is None:
                time.sleep(0.2)
                servers = _prefect_servers_of(proc.pid)
            assert servers, "rlcr train started no Prefect server of its own"
            time.sleep(1.0)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and any(map(_running, servers)):
                time.sleep(0.5)
            assert not any(map(_running, servers)), "the Prefect server outlived its rlcr train"
        finally:
            for pid in [proc.pid, *servers]:
                try:
                    os.killpg(pid, signal.SIGKILL) if pid == proc.pid else os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass


def _running(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False
