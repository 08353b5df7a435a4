"""``rlcr export``: a run's checkpoint as a plain Hugging Face model directory (a LoRA run's adapter merged)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from rlcr.cli.app import UserError, app
from rlcr.cli.inputs import check_storage, load, resolve_ref
from rlcr.presentation import console, show
from rlcr.untrusted import printable


@app.command()
def export(
    checkpoint: str = typer.Argument(..., help="RUN@ITERATION or RUN@latest (in the config's storage; `rlcr runs` "
                                               "lists them), or a checkpoint directory or URI."),
    out: str = typer.Option(..., "--out", help="New (or empty) local directory to write the model to."),
    config: Optional[str] = typer.Option(None, help="YAML config file (its storage section is used)."),
    overrides: list[str] = typer.Argument(None, help="section.field=value overrides."),
):
    """Write a checkpoint as a Hugging Face model directory (config, tokenizer, model.safetensors): a LoRA run's
    adapter merged into its base (docs/design.md §11.1), a full run's weights as they are."""
    cfg = load(config, overrides or [])
    from rlcr.adapters import export_merged
    from rlcr.run_refs import is_run_ref
    from rlcr.storage import fetch_checkpoint

    uri = resolve_ref(cfg, checkpoint, "CHECKPOINT") if is_run_ref(checkpoint) else checkpoint
    if "://" in uri:
        check_storage(cfg, uri=uri)
    target = Path(out).expanduser()
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise UserError(f"--out: {printable(str(target))} exists and is not an empty directory")
    try:
        raw = fetch_checkpoint(uri, endpoint_url=cfg.storage.s3_endpoint_url)
        written = export_merged(raw, target, endpoint_url=cfg.storage.s3_endpoint_url)
    except (FileNotFoundError, ValueError) as e:
        raise UserError(f"CHECKPOINT: {printable(e, 300)}") from None
    console.print(f"exported {show(uri)} → {show(str(written))}")
