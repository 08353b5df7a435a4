"""The one config model: YAML loading, overrides, and errors that name the field."""

import typing

import pytest

from rlcr.config import ConfigError, RLCRConfig, changes_results, load_config, result_changing_diff
from rlcr.config.fields import is_marked


def test_defaults_are_valid_and_documented():
    cfg = RLCRConfig()
    assert cfg.rollout.num_generations_confidence >= 2 and cfg.loss.agg == "token-mean"
    undocumented = [name for name, f in RLCRConfig.dotted_fields() if not f.description]
    assert undocumented == []
    assert [name for name, f in RLCRConfig.dotted_fields() if not is_marked(f)] == []  # changes or operational


def test_yaml_and_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("rollout:\n  num_generations_answer: 4\nloss:\n  agg: seq-mean-token-sum-norm\nmethod:\n"
                 "  lambda_conf: 0.5\n")
    cfg = RLCRConfig.from_yaml(p, ["rollout.num_generations_confidence=3", "method.conf_norm_mode=answer_then_prompt",
                                   "loss.clip_c=null"])
    assert (cfg.rollout.num_generations_answer, cfg.rollout.num_generations_confidence) == (4, 3)
    assert cfg.loss.agg == "seq-mean-token-sum-norm" and cfg.method.lambda_conf == 0.5
    assert cfg.method.conf_norm_mode == "answer_then_prompt" and cfg.loss.clip_c is None
    assert RLCRConfig.from_yaml(p, {"run.seed": 5}).run.seed == 5
    assert cfg.config_hash() != RLCRConfig.from_yaml(p).config_hash()
    assert cfg.config_hash() == RLCRConfig.from_yaml(p, ["rollout.num_generations_confidence=3",
                                                         "method.conf_norm_mode=answer_then_prompt",
                                                         "loss.clip_c=null"]).config_hash()


@pytest.mark.parametrize(
    "override, field",
    [
        ("rollout.num_generations_confidence=1", "rollout.num_generations_confidence"),
        ("loss.clip_low=1.5", "loss.clip_low"),
        ("loss.clip_low=-0.1", "loss.clip_low"),
        ("loss.agg=mean", "loss.agg"),
        ("loss.kl_type=k4", "loss.kl_type"),
        ("loss.clip_c=0.5", "loss.clip_c"),
        ("rollout.temperature=0", "rollout.temperature"),
        ("method.conf_norm_mode=prompt", "method.conf_norm_mode"),
        ("rollout.num_generations_answr=4", "rollout.num_generations_answr"),
        ("temperature=1.0", "rollout.temperature"),  # a flat name of older rlcr: its dotted name; cfg-codemod: keep
        ("engine_block_size=32", "engine.block_size"),  # cfg-codemod: keep
        ("tasks.options.min_count=5", "tasks.options.min_count"),
        ("tasks.min_count=5", "tasks.options.min_count"),  # moved into tasks.options: its new name
        ("engine.block_size=16", "engine.block_size"),  # vLLM's CPU backend takes multiples of 32
        ("engine.block_size=0", "engine.block_size"),
    ],
)
def test_bad_values_name_the_field(override, field):
    with pytest.raises(ConfigError) as e:
        RLCRConfig.from_yaml(None, [override])
    assert field in str(e.value)


def test_engine_block_size_is_checked_for_the_cpu_backend_only():
    assert RLCRConfig(engine={"block_size": 32}).engine.block_size == 32
    # the GPU backends take 16
    assert RLCRConfig(engine={"block_size": 16}, update={"use_gpu": True}).engine.block_size == 16


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


FLOAT_FIELDS = [name for name, f in RLCRConfig.dotted_fields() if _holds_float(f.annotation)]


def test_float_fields_are_found():
    assert {"method.lambda_conf", "update.grad_clip", "update.adam_betas", "loss.clip_c", "engine.kv_cache_gib",
            "orchestration.retry_delay_s"} <= set(FLOAT_FIELDS)


@pytest.mark.parametrize("bad", [".nan", ".inf", "-.inf"])
@pytest.mark.parametrize("field", FLOAT_FIELDS)
def test_non_finite_floats_are_refused(field, bad):
    value = f"[{bad}, 0.5]" if typing.get_origin(dict(RLCRConfig.dotted_fields())[field].annotation) is tuple else bad
    with pytest.raises(ConfigError) as e:
        RLCRConfig.from_yaml(None, [f"{field}={value}"])
    assert f"'{field}" in str(e.value)
    with pytest.raises(ConfigError) as e:  # YAML files and dicts too
        RLCRConfig.from_dict({field: [float(bad.replace(".", ""))] * 2 if "[" in value
                              else float(bad.replace(".", ""))})
    assert f"'{field}" in str(e.value)


@pytest.mark.parametrize("betas", ["[0.9, 1.0]", "[-0.1, 0.999]", "[1.5, 0.9]"])
def test_adam_betas_in_unit_interval(betas):
    with pytest.raises(ConfigError, match="update.adam_betas"):
        RLCRConfig.from_yaml(None, [f"update.adam_betas={betas}"])
    assert RLCRConfig.from_yaml(None, ["update.adam_betas=[0.0, 0.95]"]).update.adam_betas == (0.0, 0.95)


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
    assert "rollout.prompts_per_iteration" in str(e.value) and "tasks.num_train" in str(e.value)
    # with a task file the count is checked against its distinct tasks (rlcr.runs.task_sets.task_sets)
    assert RLCRConfig(tasks={"num_train": 6, "train_file": "t.jsonl"},
                      rollout={"prompts_per_iteration": 7}).rollout.prompts_per_iteration == 7


# ----------------------------------------------------------------- resume: which differences matter
def test_result_changing_diff_ignores_operational_fields():
    base = RLCRConfig(run={"seed": 3}, tasks={"num_train": 50})
    saved = base.model_dump(mode="json")
    assert result_changing_diff(saved, base) == []
    operational = base.model_copy(update={"run.iterations": 9, "orchestration.retries": 0,
                                          "orchestration.retry_delay_s": 0.5, "rollout.progress": True,
                                          "probe.cron": "0 4 * * *", "probe.samples": 3, "eval.every": 2,
                                          "run.id": "other", "storage.uri": "/elsewhere",
                                          "storage.s3_endpoint_url": "http://minio:9000"})
    assert result_changing_diff(saved, operational) == []
    changed = base.model_copy(update={"run.seed": 4, "rollout.batch_size": 8, "update.adam_betas": (0.8, 0.99),
                                      "run.iterations": 2})
    assert result_changing_diff(saved, changed) == ["rollout.batch_size", "run.seed", "update.adam_betas"]
    # the record RunStore writes ({"config": ..., "config_hash": ...}) is accepted as is
    assert result_changing_diff({"config": saved, "config_hash": base.config_hash()}, changed) == [
        "rollout.batch_size", "run.seed", "update.adam_betas"]


def test_result_changing_diff_and_fields_newer_than_the_run():
    cfg = RLCRConfig(method={"lambda_conf": 0.5})
    saved = cfg.model_dump(mode="json")
    del saved["update"]["share_prefixes"], saved["engine"]["kv_cache_gib"]  # a run recorded before these fields existed
    saved["a_removed_field"] = 1
    assert result_changing_diff(saved, cfg) == []  # missing fields hold their defaults now
    assert (result_changing_diff(saved, cfg.model_copy(update={"update.share_prefixes": False}))
            == ["update.share_prefixes"])
    assert result_changing_diff(saved, cfg.model_copy(update={"engine.kv_cache_gib": 2.0})) == ["engine.kv_cache_gib"]
    assert result_changing_diff(saved, cfg.model_copy(update={"method.lambda_conf": 1.0})) == ["method.lambda_conf"]


def test_results_markings_on_the_fields():
    fields = dict(RLCRConfig.dotted_fields())
    assert all(changes_results(fields[n]) for n in ("run.seed", "rollout.batch_size", "model.name",
                                                    "update.learning_rate", "tasks.eval_seed"))
    assert not any(changes_results(fields[n]) for n in ("run.id", "storage.uri", "run.iterations", "sft.tasks",
                                                        "probe.cron", "tracking.backend", "placement.storage_shared"))


def test_warm_start_and_probe_settings_do_not_block_a_resume():
    """The sft_* and probe_* settings are read only by the warm-start and the probe, never by the training flow:
    a resume may change them (the warm-start reaches a run through ``model``, which is result-changing)."""
    cfg = RLCRConfig()
    saved = cfg.model_dump(mode="json")
    changed = cfg.model_copy(update={"sft.tasks": 40, "sft.epochs": 3, "sft.learning_rate": 5e-5, "sft.batch_size": 4,
                                     "sft.lr_schedule": "linear", "sft.warmup_steps": 0,
                                     "probe.forced_answer_tokens": 8})
    assert result_changing_diff(saved, changed) == []
    older = {k: v for k, v in saved.items() if k != "sft"}
    older["probe"] = {k: v for k, v in saved["probe"].items() if k != "forced_answer_tokens"}
    assert result_changing_diff(older, changed) == []  # a run recorded before these fields existed
    assert result_changing_diff(saved, changed.model_copy(update={"model.name": "/warm-start"})) == ["model.name"]


@pytest.mark.parametrize("override", ["sft.tasks=0", "sft.epochs=0", "sft.learning_rate=0", "sft.batch_size=0",
                                      "sft.lr_schedule=step", "sft.warmup_steps=-1", "probe.forced_answer_tokens=0"])
def test_bad_warm_start_and_probe_values_name_the_field(override):
    with pytest.raises(ConfigError) as e:
        RLCRConfig.from_yaml(None, [override])
    assert override.split("=")[0] in str(e.value)


# ----------------------------------------------------------------- sections: flat names, YAML, docs
def test_flat_names_in_yaml_and_overrides_say_the_dotted_name(tmp_path):
    p = tmp_path / "old.yaml"
    p.write_text("temperature: 0.8\n")  # cfg-codemod: keep
    with pytest.raises(ConfigError, match=r"'temperature' is now 'rollout.temperature'") as e:
        RLCRConfig.from_yaml(p)
    assert "\n" not in str(e.value)
    p.write_text("model: tiny\n")  # a flat name that is also a section's name; cfg-codemod: keep
    with pytest.raises(ConfigError, match=r"did you mean 'model.name'"):
        RLCRConfig.from_yaml(p)
    with pytest.raises(ConfigError, match=r"did you mean 'engine.kv_cache_gib'"):
        RLCRConfig.from_yaml(None, ["engine_kv_cache_gib=1.0"])  # cfg-codemod: keep
    with pytest.raises(ConfigError, match=r"did you mean 'run.seed'"):
        RLCRConfig.from_dict({"seed": 3})  # cfg-codemod: keep
    p.write_text("rollout:\n  temperature: 0.8\nmodel:\n  name: tiny\n")
    cfg = RLCRConfig.from_yaml(p, ["rollout.top_p=0.9", "engine={kv_cache_gib: 0.5}"])
    assert ((cfg.rollout.temperature, cfg.rollout.top_p, cfg.model.name, cfg.engine.kv_cache_gib)
            == (0.8, 0.9, "tiny", 0.5))


def test_model_copy_with_dotted_keys_leaves_the_original():
    cfg = RLCRConfig()
    other = cfg.model_copy(update={"rollout.temperature": 1.5})
    assert (cfg.rollout.temperature, other.rollout.temperature, other.rollout.top_p) == (0.7, 1.5, 1.0)
    with pytest.raises(KeyError):
        cfg.model_copy(update={"rollout.temperatur": 1.0})


def test_docs_configuration_md_is_generated_from_the_fields():
    """docs/configuration.md is `python -m rlcr.config.docs`'s output: regenerate it after changing a field."""
    from rlcr.config.docs import DOCS_PATH, render

    assert DOCS_PATH.read_text(encoding="utf-8") == render()
    assert "| `rollout.temperature` | `float` | `0.7` | yes |" in render()
    assert "| `run.iterations` | `int` | `1` | no |" in render()


@pytest.mark.parametrize("name", ["tiny", "demo", "gpu", "methods"])
def test_shipped_configs_load(name):
    from pathlib import Path

    load_config(Path(__file__).parent.parent / "configs" / f"{name}.yaml")


def test_naming_the_task_a_config_already_uses_keeps_its_options(tmp_path):
    """``tasks.name=countdown`` over a file that leaves the name at its default (countdown) and sets its options:
    the same task, so its options stay (bench/protocol.yaml's overrides name the task); another task's name
    drops them (they belong to the other task)."""
    f = tmp_path / "c.yaml"
    f.write_text("tasks:\n  options:\n    min_count: 2\n    max_count: 3\n")
    assert load_config(f, ["tasks.name=countdown"]).tasks.options["min_count"] == 2
    assert load_config(f, ["tasks.name=math"]).tasks.options == {}
