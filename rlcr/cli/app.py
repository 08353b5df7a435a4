"""The ``rlcr`` command group and its user errors: a mistake in the input is one line on stderr and exit code 2
(``rlcr --debug`` adds the traceback); anything else (a bug, an outage) shows its traceback."""

from __future__ import annotations

import os
import sys
from typing import Optional

import typer
from typer.core import TyperGroup

try:  # typer vendors click (its own exceptions); an older typer uses click's
    from typer._click import exceptions as _cx
except ImportError:  # pragma: no cover
    from click import exceptions as _cx

from rlcr.untrusted import InvalidInput, printable

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# A busy 2-core machine can take a while to start Prefect's ephemeral API server.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "300")

__all__ = ["app", "models_app", "config_app", "UserError"]


class UserError(Exception):
    """A mistake in the command's input (an option, a run that does not exist, …): one line, exit code 2."""


_DEBUG = {"on": False}
"""``rlcr --debug``: an error's traceback is shown before its line."""
_USER_ERROR_TYPES = {("rlcr.runs.store", "RunConfigMismatch"), ("rlcr.runs.lease", "RunLocked"),
                     ("rlcr.runs.cluster", "ResourceError"), ("rlcr.runs.refs", "NoCommittedIteration")}
"""Refusals of the input raised past the CLI's own checks (by class, without importing their modules)."""


def _user_error_line(e: BaseException) -> Optional[str]:
    """The one line for an error the input caused, or None for anything else (a bug, an outage: traceback)."""
    from rlcr.config import ConfigError

    if isinstance(e, UserError):
        return f"error: {e}"
    if (type(e).__module__, type(e).__name__) == ("rlcr.runs.cluster", "StorageUnreachable"):
        return f"storage error: {e}"
    if isinstance(e, ConfigError):
        text = str(e)
        return text if text.startswith("config error:") else f"config error: {text}"
    if isinstance(e, InvalidInput) or any((c.__module__, c.__name__) in _USER_ERROR_TYPES for c in type(e).__mro__):
        return f"error: {e}"
    return None


def _usage_line(e: _cx.ClickException) -> str:
    """click's usage error (missing or invalid option, unknown command …) as one line with the --help hint."""
    ctx = getattr(e, "ctx", None)
    hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
    return f"error: {e.format_message()}{hint}"


def _fail(line: str, exc: Optional[BaseException], code: int) -> None:
    if exc is not None and _DEBUG["on"]:
        import traceback

        traceback.print_exception(exc)
    sys.stderr.write(printable(line, 2000) + "\n")
    sys.stderr.flush()
    sys.exit(code)


class _Group(TyperGroup):
    """The ``rlcr`` command group: a user error (a :class:`UserError`, a config error, a click usage error, a
    refusal of the run's files or state) ends the command with one line on stderr and exit code 2, before
    Ray or Prefect start wherever the input alone shows it; ``rlcr --debug`` adds the traceback."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except _cx.NoArgsIsHelpError as e:
            typer.echo(e.format_message())
            sys.exit(e.exit_code)
        except typer.Abort:  # click's form of a KeyboardInterrupt outside rlcr.cli.interrupt's commands
            _fail("stopped (Ctrl-C)", None, 130)
        except _cx.ClickException as e:
            _fail(_usage_line(e), e, e.exit_code)
        except Exception as e:  # noqa: BLE001 — user errors: one line; anything else: the traceback
            line = _user_error_line(e)
            if line is None:
                raise
            _fail(line, e, 2)
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(cls=_Group, add_completion=False, no_args_is_help=True,
                  help="RLCR: RL with calibration rewards (an answer, then its stated confidence) on the configured "
                       "task (tasks.name).")
models_app = typer.Typer(no_args_is_help=True, help="Local models.")
app.add_typer(models_app, name="models")
config_app = typer.Typer(no_args_is_help=True, help="The run configuration.")
app.add_typer(config_app, name="config")

def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"rlcr {version('rlcr')}")
        except PackageNotFoundError:
            typer.echo("rlcr (not installed: no package metadata)")
        raise typer.Exit()


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="On an error, show its traceback (a user error is otherwise "
                                                      "one line, exit code 2)."),
    version: Optional[bool] = typer.Option(None, "--version", callback=_version, is_eager=True,
                                           help="Print the version and exit."),
):
    """RLCR: RL with calibration rewards (an answer, then its stated confidence) on the configured task (tasks.name)."""
    _DEBUG["on"] = debug


