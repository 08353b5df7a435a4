"""``rlcr export``: a run's checkpoint as a plain Hugging Face model directory (a LoRA run's adapter merged).

The model is written into a temporary folder beside ``--out`` and renamed into place at the end, so ``--out`` is
either the whole model or untouched: a full disk or an interrupted export leaves no truncated
``model.safetensors`` there. The export only reads the store (a read-only store will do) and never writes into it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from rlcr.cli.app import UserError, app
from rlcr.cli.inputs import check_storage, load, resolve_ref
from rlcr.ui.presentation import console, show
from rlcr.untrusted import printable


def _target(out: str, storage_uri: str) -> Path:
    """The directory ``--out`` names, checked before anything is fetched: a link to a directory is followed, a
    dangling link is refused (nothing would say where the model went), an existing non-empty directory or a
    file is refused, and so is a directory inside a local store (it would show up there as a bogus run or
    model)."""
    given = Path(out).expanduser()
    if given.is_symlink() and not given.exists():
        raise UserError(f"--out: {printable(str(given))} is a symbolic link to nothing "
                        f"({printable(os.readlink(given), 200)}); give a new or empty directory")
    target = given.resolve()
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise UserError(f"--out: {printable(str(given))} exists and is not an empty directory")
    if "://" not in storage_uri or storage_uri.startswith("file://"):
        store = Path(storage_uri.removeprefix("file://")).expanduser().resolve()
        if target == store or store in target.parents:
            raise UserError(f"--out: {printable(str(given))} is inside the store (storage.uri "
                            f"{printable(str(store), 200)}); export the model somewhere else")
    return target


@app.command()
def export(
    checkpoint: str = typer.Argument(..., help="RUN@ITERATION or RUN@latest (in the config's storage; `rlcr runs` "
                                               "lists them), or a checkpoint directory or URI."),
    out: str = typer.Option(..., "--out", help="New (or empty) local directory to write the model to (not "
                                               "inside the store); written whole, or not at all."),
    config: Optional[str] = typer.Option(None, help="YAML config file (its storage section is used)."),
    overrides: list[str] = typer.Argument(None, help="section.field=value overrides."),
):
    """Write a checkpoint as a Hugging Face model directory (config, tokenizer, model.safetensors): a LoRA run's
    adapter merged into its base (docs/design.md §11.1), a full run's weights as they are. The directory appears
    only once it is complete (a full disk leaves nothing at --out); the store is only read."""
    cfg = load(config, overrides or [])
    from rlcr.models.adapters import export_merged
    from rlcr.runs.refs import is_run_ref
    from rlcr.storage import StorageError, atomic_directory, fetch_checkpoint

    target = _target(out, cfg.storage.uri)
    uri = resolve_ref(cfg, checkpoint, "CHECKPOINT") if is_run_ref(checkpoint) else checkpoint
    if "://" in uri:
        check_storage(cfg, uri=uri, read_only=True)
    try:
        raw = fetch_checkpoint(uri, endpoint_url=cfg.storage.s3_endpoint_url)
    except (FileNotFoundError, ValueError) as e:
        raise UserError(f"CHECKPOINT: {printable(e, 300)}") from None
    mask = os.umask(0)
    os.umask(mask)
    try:
        with atomic_directory(target, durable=True) as tmp:
            os.chmod(tmp, 0o777 & ~mask)  # a temporary folder is private; the model directory is not
            export_merged(raw, tmp, endpoint_url=cfg.storage.s3_endpoint_url)
    except (FileNotFoundError, ValueError) as e:
        raise UserError(f"CHECKPOINT: {printable(e, 300)}") from None
    except (OSError, StorageError) as e:  # a full disk, a folder that cannot be written: nothing left at --out
        why = printable(getattr(e, "strerror", None) or e, 200)
        raise UserError(f"--out {printable(str(target))}: the export failed ({why}); nothing was written "
                        f"there") from None
    console.print(f"exported {show(uri)} → {show(str(target))}")
