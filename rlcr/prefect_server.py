"""The temporary Prefect API server of a local ``rlcr train`` (Prefect's ephemeral mode), bound to the life of
the process that started it.

Prefect starts that server as a child process and stops it at exit (``atexit``). A process killed with SIGKILL
runs no exit handler: the server would be left running under init, forever. So :func:`start_guarded_server`
starts it up front (the flow's Prefect clients then use this one) and starts a watchdog beside it: a small
process in its own session that holds the read end of a pipe whose write end only this process holds. When this
process ends, however it ends, the kernel closes that end; the watchdog reads end-of-file and stops the server
(SIGTERM, then SIGKILL after :data:`STOP_GRACE_S`). The watchdog addresses the server through a pidfd opened
while the server was certainly alive (this process's unreaped child), so a reused process id is never
signalled.

Run as ``python -m rlcr.prefect_server PID`` it is that watchdog.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

__all__ = ["start_guarded_server", "watch", "STOP_GRACE_S"]

STOP_GRACE_S = 10.0
"""Seconds the server is given to stop after SIGTERM before SIGKILL."""

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
    server = SubprocessASGIServer()
    server.start()
    if server.server_process is not None:
        guard(server.server_process.pid)
    return server


def guard(pid: int) -> subprocess.Popen:
    """Start the watchdog of process ``pid`` (a child of this process): it stops ``pid`` once this process has
    ended. The watchdog runs in its own session, so a Ctrl-C at the terminal does not stop it first."""
    watchdog = subprocess.Popen([sys.executable, "-m", "rlcr.prefect_server", str(pid)], stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                close_fds=True)
    _GUARDS.append(watchdog)
    return watchdog


def watch(pid: int) -> None:
    """The watchdog's body: wait for end-of-file on stdin (the starting process has ended), then stop ``pid``."""
    try:
        handle = os.pidfd_open(pid)
    except (OSError, AttributeError):
        return  # already gone (or no pidfd on this system: nothing safe to signal)
    try:
        while sys.stdin.buffer.read(65536):
            pass
        _signal(handle, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and _alive(handle):
            time.sleep(0.1)
        if _alive(handle):
            _signal(handle, signal.SIGKILL)
    finally:
        os.close(handle)


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
