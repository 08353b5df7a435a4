"""The one config model: YAML loading, overrides, and errors that name the field."""

import pytest

from rlcr.config import ConfigError, RLCRConfig


def test_defaults_are_valid_and_documented():
    cfg = RLCRConfig()
    assert cfg.num_generations_confidence >= 2 and cfg.loss_agg == "token-mean"
    undocumented = [name for name, f in RLCRConfig.model_fields.items() if not f.description]
    assert undocumented == []


def test_yaml_and_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("num_generations_answer: 4\nloss_agg: seq-mean-token-sum-norm\nlambda_conf: 0.5\n")
    cfg = RLCRConfig.from_yaml(p, ["num_generations_confidence=3", "conf_norm_mode=answer_then_prompt", "clip_c=null"])
    assert (cfg.num_generations_answer, cfg.num_generations_confidence) == (4, 3)
    assert cfg.loss_agg == "seq-mean-token-sum-norm" and cfg.lambda_conf == 0.5
    assert cfg.conf_norm_mode == "answer_then_prompt" and cfg.clip_c is None
    assert RLCRConfig.from_yaml(p, {"seed": 5}).seed == 5
    assert cfg.config_hash() != RLCRConfig.from_yaml(p).config_hash()
    assert cfg.config_hash() == RLCRConfig.from_yaml(p, ["num_generations_confidence=3", "conf_norm_mode=answer_then_prompt", "clip_c=null"]).config_hash()


@pytest.mark.parametrize(
    "override, field",
    [
        ("num_generations_confidence=1", "num_generations_confidence"),
        ("clip_low=1.5", "clip_low"),
        ("clip_low=-0.1", "clip_low"),
        ("loss_agg=mean", "loss_agg"),
        ("kl_type=k4", "kl_type"),
        ("clip_c=0.5", "clip_c"),
        ("temperature=0", "temperature"),
        ("conf_norm_mode=prompt", "conf_norm_mode"),
        ("num_generations_answr=4", "num_generations_answr"),
        ("task_min_count=5", "task_min_count"),
    ],
)
def test_bad_values_name_the_field(override, field):
    with pytest.raises(ConfigError) as e:
        RLCRConfig.from_yaml(None, [override])
    assert field in str(e.value)


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        RLCRConfig.from_yaml(tmp_path / "missing.yaml")
    p = tmp_path / "list.yaml"
    p.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        RLCRConfig.from_yaml(p)
    with pytest.raises(ConfigError, match="field=value"):
        RLCRConfig.from_yaml(None, ["seed"])
