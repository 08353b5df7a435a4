"""The run's configuration: :class:`RLCRConfig`, its sections, and which differences matter on resume."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.fields import FieldInfo

from rlcr.config.fields import changes_results
from rlcr.config.legacy import nested_from_flat
from rlcr.config.loading import (
    ConfigError,
    check_sections,
    describe,
    flat_name_hint,
    merge_dotted,
    parse_overrides,
    read_config_text,
    safe_yaml,
)
from rlcr.config.lora import LoRASection
from rlcr.config.operations import (
    EngineSection,
    EvalSection,
    OrchestrationSection,
    PlacementSection,
    ProbeSection,
    TrackingSection,
)
from rlcr.config.sections import (
    LossSection,
    MethodSection,
    ModelSection,
    RolloutSection,
    RunSection,
    SFTSection,
    StorageSection,
    TasksSection,
    UpdateSection,
)
from rlcr.untrusted import printable


class RLCRConfig(BaseModel):
    """Configuration of an RLCR run (docs/design.md §1–§8), in sections (docs/configuration.md lists every field).
    Unknown fields are rejected; every float must be finite."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True,
                              allow_inf_nan=False)

    run: RunSection = Field(default_factory=RunSection)
    """Identity of the run: its name, master seed and length."""
    storage: StorageSection = Field(default_factory=StorageSection)
    """Where the run's artifacts go."""
    model: ModelSection = Field(default_factory=ModelSection)
    """The initial policy."""
    tasks: TasksSection = Field(default_factory=TasksSection)
    """The task, its problems (training pool and held-out set) and its own settings."""
    rollout: RolloutSection = Field(default_factory=RolloutSection)
    """Sampling the rollouts."""
    method: MethodSection = Field(default_factory=MethodSection)
    """What is trained, its rewards and advantages."""
    loss: LossSection = Field(default_factory=LossSection)
    """The clipped policy-gradient loss."""
    update: UpdateSection = Field(default_factory=UpdateSection)
    """The policy update on Ray Train."""
    sft: SFTSection = Field(default_factory=SFTSection)
    """The format warm-start (``rlcr sft``)."""
    lora: LoRASection = Field(default_factory=LoRASection)
    """Low-rank adapters instead of full fine-tuning."""
    engine: EngineSection = Field(default_factory=EngineSection)
    """The vLLM engines."""
    placement: PlacementSection = Field(default_factory=PlacementSection)
    """Where the engines and trainer run on a Ray cluster."""
    orchestration: OrchestrationSection = Field(default_factory=OrchestrationSection)
    """Checkpoints and retries of the training flow."""
    tracking: TrackingSection = Field(default_factory=TrackingSection)
    """Experiment tracking (MLflow)."""
    eval: EvalSection = Field(default_factory=EvalSection)
    """Evaluation on the held-out set."""
    probe: ProbeSection = Field(default_factory=ProbeSection)
    """The faithfulness probe."""

    @model_validator(mode="after")
    def _across_sections(self) -> "RLCRConfig":
        block = self.engine.block_size
        if block is not None and not self.update.use_gpu and block % 32:
            raise ValueError(f"engine.block_size must be a multiple of 32 for vLLM's CPU backend (update.use_gpu "
                             f"false), got {block}")
        if self.tasks.train_file is None and self.rollout.prompts_per_iteration > self.tasks.num_train:
            raise ValueError(f"rollout.prompts_per_iteration ({self.rollout.prompts_per_iteration}) must be <= "
                             f"tasks.num_train ({self.tasks.num_train}): an iteration's prompts are distinct "
                             f"training tasks")
        if self.update.old_logp_source == "rollout" and (self.loss.tis_cap or self.loss.seq_mask_band):
            raise ValueError("loss.tis_cap / loss.seq_mask_band correct π_old against the engine's log-probs; with "
                             "update.old_logp_source=rollout they are the same (every weight is 1): use recompute")
        if self.orchestration.mode == "one-step-off" and self.engine.release_during_update:
            raise ValueError("orchestration.mode one-step-off generates during the update: the engines cannot be "
                             "released then (engine.release_during_update)")
        if self.lora.enabled and self.update.fsdp:
            raise ValueError("lora.enabled with update.fsdp: not supported; LoRA runs use DDP (the adapters and their "
                             "AdamW state are small; sharding peft's wrapped base with fully_shard is not built)")
        return self

    # ------------------------------------------------------------------ fields by dotted name
    @classmethod
    def dotted_fields(cls) -> Iterator[tuple[str, FieldInfo]]:
        """Every field as ``(section.field, FieldInfo)``, in declaration order."""
        for section, info in cls.model_fields.items():
            for name, field in info.annotation.model_fields.items():
                yield f"{section}.{name}", field

    def get(self, dotted: str) -> Any:
        """The value of the field ``section.field``."""
        section, name = dotted.split(".", 1)
        return getattr(getattr(self, section), name)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> "RLCRConfig":
        """A copy with ``update`` applied: ``{"rollout.temperature": 1.0}`` sets one field of a section (the
        section is copied, the original unchanged); a plain key replaces a whole section. Not validated, as
        pydantic's ``model_copy``: build with :meth:`from_dict` to validate."""
        plain: dict[str, Any] = {}
        by_section: dict[str, dict[str, Any]] = {}
        for key, value in (update or {}).items():
            section, dot, name = key.partition(".")
            if dot:
                if section not in type(self).model_fields:
                    raise KeyError(f"no config section {section!r} (in {key!r})")
                by_section.setdefault(section, {})[name] = value
            else:
                plain[key] = value
        for section, values in by_section.items():
            unknown = set(values) - set(type(getattr(self, section)).model_fields)
            if unknown:
                raise KeyError(f"no config field {section}.{sorted(unknown)[0]}")
            plain[section] = getattr(self, section).model_copy(update=values, deep=deep)
        return super().model_copy(update=plain, deep=deep)

    # ------------------------------------------------------------------ helpers
    def config_hash(self) -> str:
        """Stable short hash of the settings (recorded in each iteration's manifest)."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "config") -> "RLCRConfig":
        """Validate a nested mapping; ``section.field`` keys are applied on top. A field name of the flat
        layout is a one-line :class:`ConfigError` naming its dotted name (stored runs' flat records are read
        with :func:`rlcr.config.legacy.nested_from_flat` instead)."""
        nested = {k: v for k, v in data.items() if "." not in str(k)}
        check_sections(nested, set(cls.model_fields), source)
        merged = merge_dotted(nested, {k: v for k, v in data.items() if "." in str(k)}, source)
        try:
            return cls.model_validate(merged)
        except ValidationError as e:
            raise ConfigError(describe(e, source)) from None

    @classmethod
    def from_yaml(
        cls, path: str | Path | None = None, overrides: Mapping[str, Any] | Sequence[str] | None = None
    ) -> "RLCRConfig":
        """Load a YAML file of sections (or defaults if None) and apply overrides (``{"section.field": v}`` or
        ``["section.field=v", …]``).

        The file is bounded (:data:`~rlcr.config.loading.MAX_CONFIG_BYTES`, UTF-8, nesting
        :data:`~rlcr.untrusted.MAX_DEPTH`, no anchors or aliases), as is each override
        (:data:`~rlcr.config.loading.MAX_OVERRIDE_CHARS`); anything else is a one-line :class:`ConfigError`
        naming the file or the override. A field name of the flat layout (``temperature``) is refused with its
        dotted name (``rollout.temperature``)."""
        data: dict[str, Any] = {}
        source = "config"
        if path is not None:
            source = printable(path)
            loaded = safe_yaml(read_config_text(path), source)
            if loaded is None:
                loaded = {}
            if not isinstance(loaded, dict):
                raise ConfigError(f"{source}: expected a mapping of section: {{field: value}}, got "
                                  f"{type(loaded).__name__}")
            check_sections(loaded, set(cls.model_fields), source)
            data.update(loaded)
        items = parse_overrides(overrides)
        for key in items:
            hint = flat_name_hint(str(key)) if "." not in str(key) and str(key) not in cls.model_fields else None
            if hint is not None:
                raise ConfigError(f"override {printable(repr(str(key)), 80)}: {hint}")
        return cls.from_dict(merge_dotted(data, items, source), source=source)


def load_config(path: str | Path | None = None,
                overrides: Mapping[str, Any] | Sequence[str] | None = None) -> RLCRConfig:
    """Shorthand for :meth:`RLCRConfig.from_yaml`."""
    return RLCRConfig.from_yaml(path, overrides)


def _unwrap(saved: Mapping[str, Any]) -> Mapping[str, Any]:
    if "config" in saved and "config_hash" in saved and isinstance(saved["config"], Mapping):
        return saved["config"]
    return saved


def result_changing_diff(saved: Mapping[str, Any], current: RLCRConfig) -> list[str]:
    """Sorted dotted names (``rollout.temperature``) of the fields whose value in ``current`` differs from
    ``saved`` and can change results (marked with :func:`~rlcr.config.fields.changes` on the field).

    ``saved`` is a run's recorded config, ``RLCRConfig.model_dump(mode="json")`` (a ``{"config": …,
    "config_hash": …}`` record is unwrapped); a record of the flat layout (runs stored before the sections) is
    read with :func:`rlcr.config.legacy.nested_from_flat`. Values are compared in that JSON form. A field
    missing from ``saved`` (added after the run started) counts as unchanged when ``current`` holds its
    default, which reproduces the older behaviour; a key of ``saved`` that is no field any more is ignored
    (the current code cannot honour it either way).
    """
    saved = nested_from_flat(_unwrap(saved))  # flat names, and fields moved since (rlcr.config.legacy)
    now = current.model_dump(mode="json")
    diff = []
    for dotted, field in type(current).dotted_fields():
        if not changes_results(field):
            continue
        section, name = dotted.split(".", 1)
        stored = saved.get(section)
        if dotted == "tasks.options":
            diff += _options_diff(stored.get(name) if isinstance(stored, Mapping) else None, current)
        elif isinstance(stored, Mapping) and name in stored:
            if stored[name] != now[section][name]:
                diff.append(dotted)
        elif current.get(dotted) != field.get_default(call_default_factory=True):
            diff.append(dotted)
    return sorted(diff)


def _options_diff(stored: Any, current: RLCRConfig) -> list[str]:
    """``tasks.options.<key>`` of each option whose value differs from the stored one (an option the record lacks:
    unchanged when it holds the task's default)."""
    from rlcr.tasks.registry import task_class

    stored = stored if isinstance(stored, Mapping) else {}
    defaults = task_class(current.tasks.name).Options().model_dump(mode="json")
    now = current.tasks.options
    return [f"tasks.options.{key}" for key in sorted(set(now) | set(stored))
            if key in now and stored.get(key, defaults.get(key)) != now[key]]


def resolve_config(config: str | None, overrides: dict | list | None, iterations: int | None) -> RLCRConfig:
    """Config file + overrides (+ iterations); raises ConfigError naming the field, before any Ray work."""
    extra = dict(overrides) if isinstance(overrides, dict) else {}
    items = list(overrides) if isinstance(overrides, (list, tuple)) else []
    cfg = load_config(config, items)
    if extra or iterations is not None:
        data = {**cfg.model_dump(), **extra}
        if iterations is not None:
            data["run.iterations"] = iterations
        cfg = RLCRConfig.from_dict(data, source=config or "config")
    return cfg
