"""A verifier's worker process, seen from the parent: started on demand, one line each way per request, killed and
started afresh when it misses a deadline or dies. The math verifier (:mod:`rlcr.tasks.math_verifier`) and any task's
bounded verifier (:mod:`rlcr.tasks.verify`) hold one each; what they send and how they read the answers is theirs.

The reply channel is private and framed. The worker is started in a session (and process group) of its own, reads
a fresh random *nonce* as its first line of input, then moves the two pipes off its file descriptors 0 and 1 (which
become ``/dev/null``) before any other code runs: C code, ``os.write(1, …)`` and child processes write nowhere and
cannot read the requests. Each reply line is ``<nonce> <sequence number> <payload>``, the sequence number being
that of the request it answers (0: the ``ready`` line); any other line is skipped, so stray output reaching the
channel (a forked child, say) can neither forge a verdict nor answer for a later request. Killing a worker kills
its whole process group: what it started dies with it. Every wait here is bounded by a deadline on the monotonic
clock. Pure standard library.
"""

from __future__ import annotations

import os
import secrets
import select
import signal
import subprocess
import time

__all__ = ["WorkerProcess"]


class WorkerProcess:
    """The worker of a subclass's :meth:`_argv`: ``_proc`` (None when none runs), started by :meth:`_wait_ready`,
    read by :meth:`_readline`, killed by :meth:`_stop`. ``restarts`` counts the workers started after the first."""

    startup_deadline_s = 120.0
    """Longest wait for a worker to say ``ready``."""
    max_reply_bytes = 1 << 20
    """Longest answer line read (and most bytes of other lines skipped while waiting for it); past it there is
    no answer (the worker is then killed by the caller)."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._buffer = b""
        self._is_ready = False
        self._spawned_at = 0.0
        self._started_once = False
        self._nonce = b""
        self._sent = 0
        self.restarts = 0

    def _argv(self) -> list[str]:
        """The worker's command line."""
        raise NotImplementedError

    def _not_started(self) -> str:
        """The one line of the RuntimeError raised when a worker does not start in time."""
        return "the verifier's worker did not start"

    def _spawn(self) -> None:
        self._proc = subprocess.Popen(self._argv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, start_new_session=True)
        self._buffer, self._is_ready, self._spawned_at = b"", False, time.monotonic()
        self._nonce, self._sent = secrets.token_hex(16).encode(), 0
        self.restarts += self._started_once
        self._started_once = True
        try:
            self._proc.stdin.write(self._nonce + b"\n")
            self._proc.stdin.flush()
        except OSError:
            pass  # it died at once: _wait_ready says it did not start

    def _wait_ready(self, until: float) -> bool:
        """Start the worker if none runs; True once it said ``ready``, False if ``until`` came first (it goes on
        starting). RuntimeError (:meth:`_not_started`) if it did not start within :attr:`startup_deadline_s`."""
        if self._proc is None or self._proc.poll() is not None:
            self._stop()
            self._spawn()
        if self._is_ready:
            return True
        limit = self._spawned_at + self.startup_deadline_s
        line = self._readline(min(until, limit))
        if line == b"ready":
            self._is_ready = True
            return True
        if line is None and time.monotonic() < limit and self._proc.poll() is None:
            return False
        self._stop()
        raise RuntimeError(self._not_started())

    def _send(self, line: bytes) -> bool:
        """Write one request line; False if the worker died (it is then stopped: the next call restarts it)."""
        try:
            self._proc.stdin.write(line + b"\n")
            self._proc.stdin.flush()
        except OSError:
            self._stop()
            return False
        self._sent += 1
        return True

    def _readline(self, deadline: float) -> bytes | None:
        """The payload of the worker's reply to the last request sent (or its ``ready`` line), or None at the
        deadline, at end of output, or past :attr:`max_reply_bytes` read. Lines not framed with this worker's
        nonce and that request's sequence number are skipped."""
        fd, frame, skipped = self._proc.stdout.fileno(), self._nonce + b" %d " % self._sent, 0
        while True:
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                if (left <= 0 or len(self._buffer) + skipped > self.max_reply_bytes
                        or not select.select([fd], [], [], left)[0]):
                    return None
                chunk = os.read(fd, 65536)
                if not chunk:
                    return None
                self._buffer += chunk
            line, self._buffer = self._buffer.split(b"\n", 1)
            if line.startswith(frame):
                return line[len(frame):].strip()
            skipped += len(line) + 1
            if skipped > self.max_reply_bytes:
                return None

    def _stop(self) -> None:
        """Kill the worker and its process group (what it started), and reap it."""
        proc, self._proc, self._is_ready = self._proc, None, False
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # its own session's group, led by it (start_new_session)
            except OSError:
                proc.kill()  # the group is gone (it and all it started have exited)
            proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                try:
                    pipe.close()
                except OSError:
                    pass
