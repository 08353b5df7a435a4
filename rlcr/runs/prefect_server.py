"""The temporary Prefect API server of a local ``rlcr train`` (Prefect's ephemeral mode), bound to the life of
the process that started it.

Prefect starts that server as a child process and stops it at exit (``atexit``). A process killed with SIGKILL
runs no exit handler: the server would be left running under init, forever. So :func:`start_guarded_server`
starts a watchdog first, then the server (the flow's Prefect clients then use this one). The watchdog is a small
process in its own session that holds the read end of a pipe whose write end only this process holds, and that
watches this process's children every :data:`POLL_S` seconds (once a second after it has seen a server): each
Prefect server among them it addresses through a pidfd opened while the server was certainly alive (this process's
child), so a reused process id is never signalled. When this process ends, however it ends, the kernel closes the pipe's
write end; the watchdog reads end-of-file and stops the servers it saw (SIGTERM, then SIGKILL after
:data:`STOP_GRACE_S`). Only a server started less than :data:`POLL_S` before a SIGKILL can escape it.

Run as ``python -m rlcr.runs.prefect_server PID`` it is the watchdog of process PID's Prefect servers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

__all__ = ["start_guarded_server", "guard", "watch", "STOP_GRACE_S", "POLL_S", "READY_WAIT_S"]

STOP_GRACE_S = 10.0
"""Seconds the server is given to stop after SIGTERM before SIGKILL."""
POLL_S = 0.05
"""How often the watchdog looks for new Prefect servers among the guarded process's children."""
READY_WAIT_S = 10.0
"""Longest wait for the watchdog to say it is watching, before the server is started anyway."""
_SERVER_MARK = b"prefect.server.api.server"
"""What a Prefect API server's command line holds (``uvicorn … --factory prefect.server.api.server:create_app``)."""

_GUARDS: list[Any] = []
"""The watchdogs this process started (kept: their pipe's write end must stay open for the process's life)."""


def start_guarded_server() -> Any:
    """Start Prefect's temporary API server, unless a server is configured (``PREFECT_API_URL``), and a watchdog
    that stops it when this process ends, SIGKILL included. Returns the server (Prefect's
    ``SubprocessASGIServer``, the one its clients use) or None where a server is configured."""
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return None
    guard(os.getpid())
    server = SubprocessASGIServer()
    spawn = getattr(server, "_run_uvicorn_command", None)
    if callable(spawn):  # the server starts with SIGINT blocked: a Ctrl-C at the terminal is rlcr's to handle
        server._run_uvicorn_command = lambda: _without_sigint(spawn)
        server.start()
    else:  # pragma: no cover — another Prefect: SIGINT waits while the server starts
        _without_sigint(server.start)
    return server


def _without_sigint(spawn):
    """``spawn()`` with SIGINT blocked in this thread, so the processes it starts inherit the block: the terminal's
    Ctrl-C (sent to the whole foreground process group) reaches rlcr, which stops the flow while the server still
    answers (a server stopped first turns every Prefect call of the unwinding flow into a minute of retries and
    tracebacks). The server is stopped at exit by Prefect, or by the watchdog."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        return spawn()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def guard(pid: int) -> subprocess.Popen:
    """Start the watchdog of the Prefect servers that process ``pid`` (this process) starts: it stops them once
    this process has ended. The watchdog runs in its own session, so a Ctrl-C at the terminal does not stop it
    first."""
    import select

    watchdog = subprocess.Popen([sys.executable, "-m", "rlcr.runs.prefect_server", str(pid)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True,
                                close_fds=True)
    _GUARDS.append(watchdog)
    select.select([watchdog.stdout], [], [], READY_WAIT_S)  # watching before the server starts (bounded wait)
    watchdog.stdout.close()
    return watchdog


def watch(parent: int) -> None:
    """The watchdog's body: until end-of-file on stdin (the starting process has ended), keep a pidfd of each
    Prefect server among ``parent``'s children; then stop them."""
    import select

    handles: dict[int, int] = {}
    try:
        os.write(1, b"ready\n")
        os.close(1)
        while True:
            # fast until the server is seen (it starts right after the watchdog), then once a second
            ready, _, _ = select.select([sys.stdin.buffer], [], [], POLL_S if not handles else 1.0)
            if ready and not os.read(sys.stdin.fileno(), 65536):
                break
            for pid in _servers_of(parent):
                if pid not in handles:
                    try:
                        handles[pid] = os.pidfd_open(pid)
                    except OSError:
                        pass
        for handle in handles.values():
            _signal(handle, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and any(_alive(h) for h in handles.values()):
            time.sleep(0.1)
        for handle in handles.values():
            if _alive(handle):
                _signal(handle, signal.SIGKILL)
    finally:
        for handle in handles.values():
            os.close(handle)


def _servers_of(parent: int) -> list[int]:
    """The children of ``parent`` that are Prefect API servers (from ``/proc``: its threads' lists of children where
    the kernel keeps them, else every process's parent id)."""
    pids: set[int] = set()
    try:
        for thread in os.listdir(f"/proc/{parent}/task"):  # a child is listed under the thread that started it
            with open(f"/proc/{parent}/task/{thread}/children") as f:
                pids.update(int(p) for p in f.read().split())
    except (OSError, ValueError):
        pids = {int(p) for p in os.listdir("/proc") if p.isdigit()}
    found = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(") ", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent and _SERVER_MARK in cmdline:
            found.append(pid)
    return found


def _signal(handle: int, sig: int) -> None:
    try:
        signal.pidfd_send_signal(handle, sig)
    except ProcessLookupError:
        pass


def _alive(handle: int) -> bool:
    """Whether the process of pidfd ``handle`` is still running (the pidfd reads ready once it has exited)."""
    import select

    ready, _, _ = select.select([handle], [], [], 0)
    return not ready


if __name__ == "__main__":
    watch(int(sys.argv[1]))
