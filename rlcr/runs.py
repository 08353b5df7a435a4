"""Run bookkeeping: task sets, per-iteration prompts, manifests, commit and resume.

A run lives under ``<storage>/runs/<run_id>/``. Iteration k (from 1) writes its
artifacts under ``iter-<kkkk>/`` and is *committed* by writing
``iter-<kkkk>/manifest.json`` last. Anything without a manifest is an
uncommitted attempt: a re-run overwrites it, and readers ignore it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from rlcr.config import RLCRConfig
from rlcr.storage import Store, iteration_prefix
from rlcr.tasks.sets import prompts_for_iteration, task_sets

__all__ = ["RunStore", "RunConfigMismatch", "task_sets", "prompts_for_iteration", "new_run_id"]


class RunConfigMismatch(ValueError):
    """Resuming a run with settings that differ from the ones it started with."""


def new_run_id() -> str:
    return time.strftime("run-%Y%m%d-%H%M%S")


@dataclass
class RunStore:
    """The artifacts of one run in a :class:`~rlcr.storage.Store`."""

    store: Store
    run_id: str

    @classmethod
    def open(cls, cfg: RLCRConfig, run_id: str) -> "RunStore":
        return cls(Store(cfg.storage_uri, endpoint_url=cfg.s3_endpoint_url), run_id)

    @property
    def prefix(self) -> str:
        return f"runs/{self.run_id}"

    def iteration_dir(self, iteration: int) -> str:
        return iteration_prefix(self.run_id, iteration)

    # ---------------------------------------------------------------- config
    def check_config(self, cfg: RLCRConfig) -> None:
        """Record the run's config on first use; on resume refuse a config with other settings."""
        rel = f"{self.prefix}/config.json"
        current = cfg.model_dump(mode="json")
        if not self.store.exists(rel):
            self.store.write_json(rel, {"config": current, "config_hash": cfg.config_hash()})
            return
        saved = self.store.read_json(rel)
        if saved["config_hash"] == cfg.config_hash():
            return
        ignored = {"iterations"}  # extending a run is a resume, not a change
        diff = sorted(k for k in set(saved["config"]) | set(current)
                      if k not in ignored and saved["config"].get(k) != current.get(k))
        if diff:
            details = ", ".join(f"{k}: {saved['config'].get(k)!r} → {current.get(k)!r}" for k in diff)
            raise RunConfigMismatch(f"run {self.run_id!r} was started with other settings ({details}); "
                                    "use a new run_id or the original config")

    # ---------------------------------------------------------------- manifests
    def manifest(self, iteration: int) -> dict[str, Any] | None:
        rel = f"{self.iteration_dir(iteration)}/manifest.json"
        return self.store.read_json(rel) if self.store.exists(rel) else None

    def committed(self) -> list[dict[str, Any]]:
        """Manifests of the committed iterations 1..k, in order (stops at the first gap)."""
        out = []
        k = 1
        while (m := self.manifest(k)) is not None:
            out.append(m)
            k += 1
        return out

    def last_committed(self) -> dict[str, Any] | None:
        done = self.committed()
        return done[-1] if done else None

    def commit(self, iteration: int, manifest: dict[str, Any]) -> str:
        """Write the manifest last: after this, the iteration exists."""
        ckpt = manifest.get("checkpoint_uri")
        if ckpt and not self.store.is_complete(self.store.rel(ckpt)):
            raise RuntimeError(f"refusing to commit iteration {iteration}: checkpoint {ckpt} is not sealed")
        manifest = {**manifest, "run_id": self.run_id, "iteration": iteration, "committed_at": time.time()}
        rel = f"{self.iteration_dir(iteration)}/manifest.json"
        self.store.write_json(rel, manifest)
        return self.store.url(rel)
