"""Ctrl-C during a long command (``rlcr train``, the demo's training): answered at once, over within seconds.

The first SIGINT prints one line at once: what is being cancelled, which iterations are committed and the command
that resumes the run. The command then unwinds as after any error (engines and trainer stopped, the MLflow run
closed as ``KILLED``, the run's lease released), for at most :data:`GRACE_S`; it ends with a last line and exit code
130, with no traceback (what the libraries print while stopping goes to the command's log file), skipping Ray's and
Prefect's exit handlers (seconds of shutdown; their processes end with this one). Past the grace period, or at a
second Ctrl-C, the process ends at once (``os._exit(130)``) with the same last line.

Ending at once loses nothing a resume needs: an iteration exists only once committed (its manifest written after its
state was sealed), everything before that is redone, and a run's lease left by a process of this machine that is
gone is taken over at once (:mod:`rlcr.runs.lease`). Ray's local processes share the driver's fate; Prefect's temporary
server is stopped by its watchdog (:mod:`rlcr.runs.prefect_server`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from typing import Callable, Iterator, Optional

__all__ = ["GRACE_S", "EXIT_CODE", "Interrupts", "interruptible"]

GRACE_S = 8.0
"""Seconds the command may spend unwinding after the first Ctrl-C before it ends at once."""
EXIT_CODE = 130
"""The exit code of a command ended by Ctrl-C (128 + SIGINT, as shells report it)."""


class Interrupts:
    """The SIGINT handler of one command (see the module docstring). ``acknowledge()`` returns the line shown at
    the first Ctrl-C (it may also stop a live display), ``farewell(seconds)`` the last line; both are called once
    and must not raise (a failure shows a plainer line)."""

    def __init__(self, acknowledge: Callable[[], str], farewell: Callable[[float], str], grace_s: float = GRACE_S):
        self.acknowledge, self.farewell, self.grace_s = acknowledge, farewell, grace_s
        self.requested_at: Optional[float] = None
        self._said_goodbye = threading.Lock()
        self._terminal = os.dup(sys.stdout.fileno()) if _has_fileno(sys.stdout) else None
        self._previous = None
        self._echo: Optional[tuple[int, list]] = None

    @property
    def requested(self) -> bool:
        return self.requested_at is not None

    def install(self) -> None:
        """Handle SIGINT from now on (main thread only; elsewhere nothing changes)."""
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
            self._quiet_echo()

    def uninstall(self) -> None:
        """Give SIGINT back to its previous handler, unless a Ctrl-C came: then a second one must still end the
        process at once while it shuts down."""
        self._restore_echo()
        if self._previous is not None and not self.requested:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None
        if self._terminal is not None and not self.requested:
            os.close(self._terminal)
            self._terminal = None

    def _on_sigint(self, signum, frame) -> None:
        if self.requested:
            self.end_now("a second Ctrl-C")
            return
        self.requested_at = time.monotonic()
        try:
            line = self.acknowledge()
        except Exception as e:  # noqa: BLE001 — the interrupt must be answered whatever the display does
            line = f"stopping (Ctrl-C) ({type(e).__name__} while describing the run's state)"
        self.write(line)
        timer = threading.Timer(self.grace_s, self.end_now, args=(f"still stopping after {self.grace_s:.0f} s",))
        timer.daemon = True
        timer.start()
        raise KeyboardInterrupt

    def end_now(self, why: str) -> None:
        """End the process at once with :data:`EXIT_CODE`, after the last line (``why``: what forced it, shown)."""
        self.goodbye(f" ({why}: ended at once)" if why else "")
        self._restore_echo()
        for stream in (sys.stdout, sys.stderr):  # what is buffered reaches the log file
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(EXIT_CODE)

    def goodbye(self, suffix: str = "") -> None:
        """The last line, once (a forced end racing the unwinding's own goodbye shows one of them)."""
        if not self._said_goodbye.acquire(blocking=False):
            return
        took = time.monotonic() - self.requested_at if self.requested_at is not None else 0.0
        try:
            line = self.farewell(took)
        except Exception as e:  # noqa: BLE001
            line = f"stopped ({type(e).__name__} while describing the run's state)"
        self.write(line + suffix)

    def write(self, line: str) -> None:
        """A line (or lines) on the terminal the command started on, whatever its descriptors point at now: on a
        terminal after clearing the live display's line (and showing the cursor it hid)."""
        from rlcr.untrusted import printable

        fd = self._terminal
        if fd is None:
            return
        tty = os.isatty(fd)
        prefix, suffix = (b"\r\x1b[2K", b"\x1b[?25h") if tty else (b"", b"")
        width = _columns(fd) if tty else None
        text = "".join(wrapped(printable(part, 2000), width) + "\n" for part in line.split("\n"))
        with contextlib.suppress(OSError):
            os.write(fd, prefix + text.encode("utf-8", "replace") + suffix)

    # ------------------------------------------------------------------ the terminal's echo of ^C
    def _quiet_echo(self) -> None:
        """No ``^C`` echoed by the terminal while the command runs: after a live bar as wide as the terminal the
        echo wraps to a new line and the bar's last frame is drawn twice. Given back by :meth:`_restore_echo`."""
        import termios

        with contextlib.suppress(OSError, termios.error, ValueError):
            fd = sys.stdin.fileno()
            if os.isatty(fd) and os.getpgrp() == os.tcgetpgrp(fd):  # the foreground command of its terminal
                attrs = termios.tcgetattr(fd)
                if attrs[3] & termios.ECHOCTL:
                    self._echo = (fd, list(attrs))
                    attrs[3] &= ~termios.ECHOCTL
                    termios.tcsetattr(fd, termios.TCSANOW, attrs)

    def _restore_echo(self) -> None:
        import termios

        saved, self._echo = self._echo, None
        if saved is not None:
            with contextlib.suppress(OSError, termios.error, ValueError):
                termios.tcsetattr(saved[0], termios.TCSANOW, saved[1])


def _columns(fd: int) -> Optional[int]:
    try:
        return os.get_terminal_size(fd).columns
    except OSError:
        return None


def wrapped(line: str, width: Optional[int]) -> str:
    """``line`` broken between words to ``width`` columns (None: as it is); a command line (``rlcr …``) is broken
    with shell continuations (`` \\``), so what is shown still pastes as one command."""
    import textwrap

    if not width or len(line) <= width or width < 20:
        return line
    if line.startswith("rlcr "):
        parts = textwrap.wrap(line, width - 2, break_long_words=False, break_on_hyphens=False,
                              subsequent_indent="    ")
        return " \\\n".join(parts)
    return "\n".join(textwrap.wrap(line, width, break_long_words=False, break_on_hyphens=False))


def _has_fileno(stream) -> bool:
    try:
        stream.fileno()
        return True
    except (AttributeError, ValueError, OSError):
        return False


@contextlib.contextmanager
def interruptible(acknowledge: Callable[[], str], farewell: Callable[[float], str],
                  grace_s: Optional[float] = None, exit_now: bool = True) -> Iterator[Interrupts]:
    """Run the block under :class:`Interrupts`; a Ctrl-C (whatever exception it became while unwinding) ends it
    with the last line and then the process (``exit_now``: the block has closed what it opened; Ray's local
    processes share the driver's fate and Prefect's temporary server has its watchdog, so their exit handlers,
    seconds of shutdown, are skipped), or ``typer.Exit(130)`` (``exit_now`` False). Enter before the command's
    output is routed to its log file: the lines go to the terminal it started on."""
    import typer

    handler = Interrupts(acknowledge, farewell, GRACE_S if grace_s is None else grace_s)
    handler.install()
    try:
        yield handler
    except BaseException:
        if not handler.requested:
            raise
        handler.goodbye()
        if exit_now:  # what is left is Ray's and Prefect's exit handlers: their processes end with this one
            handler.end_now("")
        raise typer.Exit(EXIT_CODE) from None
    finally:
        handler.uninstall()
