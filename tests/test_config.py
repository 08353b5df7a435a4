"""The one config model: YAML loading, overrides, and errors that name the field."""

import typing

import pytest

from rlcr.config import OPERATIONAL_FIELDS, ConfigError, RLCRConfig, load_config, result_changing_diff


def test_defaults_are_valid_and_documented():
    cfg = RLCRConfig()
    assert cfg.rollout.num_generations_confidence >= 2 and cfg.loss.agg == "token-mean"
    undocumented = [name for name, f in RLCRConfig.model_fields.items() if not f.description]
    assert undocumented == []


def test_yaml_and_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("num_generations_answer: 4\nloss_agg: seq-mean-token-sum-norm\nlambda_conf: 0.5\n")
    cfg = RLCRConfig.from_yaml(p, ["rollout.num_generations_confidence=3", "method.conf_norm_mode=answer_then_prompt", "loss.clip_c=null"])
    assert (cfg.rollout.num_generations_answer, cfg.rollout.num_generations_confidence) == (4, 3)
    assert cfg.loss.agg == "seq-mean-token-sum-norm" and cfg.method.lambda_conf == 0.5
    assert cfg.method.conf_norm_mode == "answer_then_prompt" and cfg.loss.clip_c is None
    assert RLCRConfig.from_yaml(p, {"run.seed": 5}).seed == 5
    assert cfg.config_hash() != RLCRConfig.from_yaml(p).config_hash()
    assert cfg.config_hash() == RLCRConfig.from_yaml(p, ["rollout.num_generations_confidence=3", "method.conf_norm_mode=answer_then_prompt", "loss.clip_c=null"]).config_hash()


@pytest.mark.parametrize(
    "override, field",
    [
        ("rollout.num_generations_confidence=1", "num_generations_confidence"),
        ("loss.clip_low=1.5", "clip_low"),
        ("loss.clip_low=-0.1", "clip_low"),
        ("loss.agg=mean", "loss_agg"),
        ("loss.kl_type=k4", "kl_type"),
        ("loss.clip_c=0.5", "clip_c"),
        ("rollout.temperature=0", "temperature"),
        ("method.conf_norm_mode=prompt", "conf_norm_mode"),
        ("num_generations_answr=4", "num_generations_answr"),
        ("tasks.min_count=5", "task_min_count"),
        ("engine.block_size=16", "engine_block_size"),  # vLLM's CPU backend takes multiples of 32
        ("engine.block_size=0", "engine_block_size"),
    ],
)
def test_bad_values_name_the_field(override, field):
    with pytest.raises(ConfigError) as e:
        RLCRConfig.from_yaml(None, [override])
    assert field in str(e.value)


def test_engine_block_size_is_checked_for_the_cpu_backend_only():
    assert RLCRConfig(engine={"block_size": 32}).engine.block_size == 32
    assert RLCRConfig(engine={"block_size": 16}, update={"use_gpu": True}).engine.block_size == 16  # the GPU backends take 16


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        RLCRConfig.from_yaml(tmp_path / "missing.yaml")
    p = tmp_path / "list.yaml"
    p.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        RLCRConfig.from_yaml(p)
    with pytest.raises(ConfigError, match="field=value"):
        RLCRConfig.from_yaml(None, ["seed"])


def _holds_float(annotation) -> bool:
    return annotation is float or any(_holds_float(a) for a in typing.get_args(annotation))


FLOAT_FIELDS = [name for name, f in RLCRConfig.model_fields.items() if _holds_float(f.annotation)]


def test_float_fields_are_found():
    assert {"lambda_conf", "grad_clip", "adam_betas", "clip_c", "engine_kv_cache_gib", "retry_delay_s"} <= set(FLOAT_FIELDS)


@pytest.mark.parametrize("bad", [".nan", ".inf", "-.inf"])
@pytest.mark.parametrize("field", FLOAT_FIELDS)
def test_non_finite_floats_are_refused(field, bad):
    value = f"[{bad}, 0.5]" if typing.get_origin(RLCRConfig.model_fields[field].annotation) is tuple else bad
    with pytest.raises(ConfigError) as e:
        RLCRConfig.from_yaml(None, [f"{field}={value}"])
    assert f"'{field}" in str(e.value)
    with pytest.raises(ConfigError) as e:  # YAML files and dicts too
        RLCRConfig.from_dict({field: [float(bad.replace(".", ""))] * 2 if "[" in value else float(bad.replace(".", ""))})
    assert f"'{field}" in str(e.value)


@pytest.mark.parametrize("betas", ["[0.9, 1.0]", "[-0.1, 0.999]", "[1.5, 0.9]"])
def test_adam_betas_in_unit_interval(betas):
    with pytest.raises(ConfigError, match="adam_betas"):
        RLCRConfig.from_yaml(None, [f"update.adam_betas={betas}"])
    assert RLCRConfig.from_yaml(None, ["update.adam_betas=[0.0, 0.95]"]).adam_betas == (0.0, 0.95)


@pytest.mark.parametrize("override", ["run.seed=[", "model.name={a: 1", "method.lambda_conf=: x: y"])
def test_unparseable_override_is_a_config_error(override):
    with pytest.raises(ConfigError) as e:
        RLCRConfig.from_yaml(None, [override])
    assert repr(override) in str(e.value) and "not valid YAML" in str(e.value)
    with pytest.raises(ConfigError):
        load_config(None, [override])


def test_more_prompts_than_training_tasks_is_refused():
    with pytest.raises(ConfigError) as e:
        RLCRConfig.from_yaml(None, ["tasks.num_train=6", "rollout.prompts_per_iteration=7"])
    assert "prompts_per_iteration" in str(e.value) and "num_train_tasks" in str(e.value)
    # with a task file the count is checked against its distinct tasks (rlcr.tasks.sets.task_sets)
    assert RLCRConfig(tasks={"num_train": 6, "train_file": "t.jsonl"}, rollout={"prompts_per_iteration": 7}).rollout.prompts_per_iteration == 7


# ----------------------------------------------------------------- resume: which differences matter
def test_result_changing_diff_ignores_operational_fields():
    base = RLCRConfig(run={"seed": 3}, tasks={"num_train": 50})
    saved = base.model_dump(mode="json")
    assert result_changing_diff(saved, base) == []
    operational = base.model_copy(update={"run.iterations": 9, "orchestration.retries": 0, "orchestration.retry_delay_s": 0.5, "rollout.progress": True,
                                          "probe.cron": "0 4 * * *", "probe.samples": 3, "eval.every": 2,
                                          "run.id": "other", "storage.uri": "/elsewhere",
                                          "storage.s3_endpoint_url": "http://minio:9000"})
    assert result_changing_diff(saved, operational) == []
    changed = base.model_copy(update={"run.seed": 4, "rollout.batch_size": 8, "update.adam_betas": (0.8, 0.99), "run.iterations": 2})
    assert result_changing_diff(saved, changed) == ["adam_betas", "rollout_batch_size", "seed"]
    # the record RunStore writes ({"config": ..., "config_hash": ...}) is accepted as is
    assert result_changing_diff({"config": saved, "config_hash": base.config_hash()}, changed) == [
        "adam_betas", "rollout_batch_size", "seed"]


def test_result_changing_diff_and_fields_newer_than_the_run():
    cfg = RLCRConfig(method={"lambda_conf": 0.5})
    saved = cfg.model_dump(mode="json")
    del saved["update"]["share_prefixes"], saved["engine"]["kv_cache_gib"]  # a run recorded before these fields existed
    saved["a_removed_field"] = 1
    assert result_changing_diff(saved, cfg) == []  # missing fields hold their defaults now
    assert result_changing_diff(saved, cfg.model_copy(update={"update.share_prefixes": False})) == ["share_prefixes"]
    assert result_changing_diff(saved, cfg.model_copy(update={"engine.kv_cache_gib": 2.0})) == ["engine_kv_cache_gib"]
    assert result_changing_diff(saved, cfg.model_copy(update={"method.lambda_conf": 1.0})) == ["lambda_conf"]


def test_operational_fields_are_fields():
    assert OPERATIONAL_FIELDS <= set(RLCRConfig.model_fields)
    assert not {"seed", "rollout_batch_size", "model", "learning_rate", "eval_seed"} & OPERATIONAL_FIELDS


def test_warm_start_and_probe_settings_do_not_block_a_resume():
    """The sft_* and probe_* settings are read only by the warm-start and the probe, never by the training flow:
    a resume may change them (the warm-start reaches a run through ``model``, which is result-changing)."""
    cfg = RLCRConfig()
    saved = cfg.model_dump(mode="json")
    changed = cfg.model_copy(update={"sft.tasks": 40, "sft.epochs": 3, "sft.learning_rate": 5e-5, "sft.batch_size": 4,
                                     "sft.lr_schedule": "linear", "sft.warmup_steps": 0, "probe.forced_answer_tokens": 8})
    assert result_changing_diff(saved, changed) == []
    older = {k: v for k, v in saved.items() if not k.startswith("sft_") and k != "probe_forced_answer_tokens"}
    assert result_changing_diff(older, changed) == []  # a run recorded before these fields existed
    assert result_changing_diff(saved, changed.model_copy(update={"model.name": "/warm-start"})) == ["model"]


@pytest.mark.parametrize("override", ["sft.tasks=0", "sft.epochs=0", "sft.learning_rate=0", "sft.batch_size=0",
                                      "sft.lr_schedule=step", "sft.warmup_steps=-1", "probe.forced_answer_tokens=0"])
def test_bad_warm_start_and_probe_values_name_the_field(override):
    with pytest.raises(ConfigError) as e:
        RLCRConfig.from_yaml(None, [override])
    assert override.split("=")[0] in str(e.value)
