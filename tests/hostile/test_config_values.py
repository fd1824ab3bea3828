"""Absurd config values and malformed tokenizer files are refused in one line naming the field, before any
weight is read (issue 35, item 4: `rope_theta` 0, `rope_scaling.factor` 1e30 and `torch_dtype` "float1024" used to
load and run; `rms_norm_eps` -1 printed a driver-thread traceback, `num_key_value_heads` 0 a bare ZeroDivisionError,
`hidden_act` "evil" a bare KeyError, a BPE tokenizer.json without `added_tokens` `KeyError: 'added_tokens'`)."""

from __future__ import annotations

import json
import shutil

import pytest

import specdec
from specdec.loading import inspect_checkpoint

BAD = [
    ({"rope_theta": 0}, "rope_theta 0; it must be a finite number in (0"),
    ({"rope_theta": -1.0}, "rope_theta -1.0"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 0.0}}, "rope_parameters.rope_theta 0.0"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 1e30}}, "rope_scaling.factor 1e+30"),
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": float("inf")}}, "rope_parameters.factor"),
    ({"torch_dtype": "float1024"}, "torch_dtype 'float1024'; it must be a torch dtype name"),
    ({"dtype": "float1024"}, "dtype 'float1024'"),
    ({"rms_norm_eps": -1}, "rms_norm_eps -1"),
    ({"rms_norm_eps": float("nan")}, "rms_norm_eps nan"),
    ({"num_key_value_heads": 0}, "num_key_value_heads 0; it must be an integer >= 1"),
    ({"num_key_value_heads": 3}, "num_key_value_heads 3; it must be a divisor of the 4 attention heads"),
    ({"hidden_act": "evil"}, "hidden_act 'evil'; it must be an activation transformers knows"),
    ({"partial_rotary_factor": 2.0}, "partial_rotary_factor 2.0"),
    ({"head_dim": 0}, "head_dim 0"),
    ({"num_attention_heads": 3, "num_key_value_heads": 1, "head_dim": None},
     "num_attention_heads 3; it must be a divisor of hidden_size"),
]


def _edited(checkpoints, tmp_path, changes: dict, name="bad"):
    folder = tmp_path / name
    shutil.copytree(checkpoints["good"], folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    config = {k: v for k, v in config.items() if v is not None}  # (None: the field left out)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("changes, shown", BAD, ids=[next(iter(c)) + "-" + str(i) for i, (c, _) in enumerate(BAD)])
def test_an_absurd_config_value_is_refused_naming_the_field(checkpoints, tmp_path, changes, shown):
    folder = _edited(checkpoints, tmp_path, changes)
    with pytest.raises(ValueError) as caught:
        inspect_checkpoint(folder, what="target")
    message = str(caught.value)
    assert shown in message and "\n" not in message and message.startswith("target: ")


def test_load_refuses_before_reading_a_weight(checkpoints, tmp_path, monkeypatch):
    import transformers

    def no_weights(*args, **kwargs):
        raise AssertionError("from_pretrained was called")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_weights)
    folder = _edited(checkpoints, tmp_path, {"hidden_act": "evil"})
    with pytest.raises(ValueError, match="hidden_act 'evil'"):
        specdec.load(str(folder))


def test_real_values_pass(checkpoints, tmp_path):  # the negative control: real models' values
    for i, changes in enumerate([{}, {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}},
                                 {"torch_dtype": "bfloat16", "rms_norm_eps": 1e-6, "hidden_act": "gelu_pytorch_tanh"},
                                 {"num_attention_heads": 4, "num_key_value_heads": 1, "rope_theta": 5e5}]):
        assert inspect_checkpoint(_edited(checkpoints, tmp_path, changes, f"ok{i}"))["model_type"] == "llama"


def _tokenizer_folder(checkpoints, tmp_path, edit, name):
    folder = tmp_path / name
    shutil.copytree(checkpoints["good"], folder)
    data = json.loads((folder / "tokenizer.json").read_text())
    edit(data)
    (folder / "tokenizer.json").write_text(json.dumps(data))
    return folder


@pytest.mark.parametrize("edit, shown", [
    (lambda d: d.pop("added_tokens"), "tokenizer.json: added_tokens must be a list"),
    (lambda d: d["model"].update(type="BPE", vocab={"a": 0}, merges=[1, 2]), "tokenizer.json: model.merges"),
    (lambda d: d["model"].update(type="Evil"), "tokenizer.json: model.type 'Evil'"),
    (lambda d: d["model"].update(vocab=[1, 2]), "tokenizer.json: model.vocab"),
], ids=["no-added-tokens", "merges", "type", "vocab"])
def test_a_malformed_tokenizer_json_is_refused_naming_the_field(checkpoints, tmp_path, edit, shown):
    folder = _tokenizer_folder(checkpoints, tmp_path, edit, "tok")
    with pytest.raises(ValueError) as caught:
        specdec.loading.load_tokenizer(folder)
    assert shown in str(caught.value) and "KeyError" not in str(caught.value) and "\n" not in str(caught.value)


def test_a_good_tokenizer_loads(checkpoints):  # the negative control
    assert len(specdec.loading.load_tokenizer(checkpoints["good"])) > 0


def test_transformers_default_configs_pass():  # the negative control, for every family the engine covers and more
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from specdec.fast.families import FAMILIES
    from specdec.loading.config_values import check_values

    for model_type in (*FAMILIES, "glm4_moe", "qwen3_moe", "mixtral", "deepseek_v3", "t5", "bart", "opt", "phi"):
        check_values(CONFIG_MAPPING[model_type]().to_dict(), model_type, "model")
