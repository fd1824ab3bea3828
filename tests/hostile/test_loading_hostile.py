"""specdec.loading on hostile folders: refused before transformers runs anything, with the folder named."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from specdec.loading import inspect_checkpoint, load_model, load_tokenizer, resolve_device, resolve_dtype


@pytest.mark.parametrize("name, error, fragment", [
    ("evil", ValueError, "custom code"),
    ("automap", ValueError, "custom code"),
    ("traversal", ValueError, "outside the checkpoint folder"),
    ("truncated", ValueError, "truncated"),
    ("corrupt", ValueError, "not a valid safetensors"),
    ("vocab0", ValueError, "vocab_size"),
    ("pickle", ValueError, "allow_pickle"),
])
def test_refused_with_a_named_reason(checkpoints, monkeypatch, name, error, fragment):
    import transformers

    def never(*args, **kwargs):
        raise AssertionError("transformers was asked to load the weights")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", never)
    with pytest.raises(error, match=fragment) as info:
        load_model(checkpoints[name], what="target")
    assert str(info.value).startswith("target")
    assert not checkpoints["marker"].exists()


def test_sliding_window_checkpoint_loads_for_the_engine(checkpoints):
    """The engine rolls sliding windows back, so loading no longer refuses them (the transformers loop still does,
    naming the engine: tests/hostile/test_api_hostile.py)."""
    model = load_model(checkpoints["mistral"], device="cpu")
    assert model.config.sliding_window == 8


def test_good_and_opted_in_pickle_load(checkpoints):
    good = load_model(checkpoints["good"], device="cpu")
    pickled = load_model(checkpoints["pickle"], device="cpu", allow_pickle=True)
    ids = torch.tensor([[1, 2, 3]])
    assert torch.equal(good(ids).logits, pickled(ids).logits)
    assert not good.training and good.dtype == torch.float32


def test_shard_index_entries(checkpoints, tmp_path):
    folder = tmp_path / "ck"
    shutil.copytree(checkpoints["good"], folder)
    (folder / "model.safetensors").rename(folder / "shard-1.safetensors")
    index = folder / "model.safetensors.index.json"
    for bad, fragment in (("/etc/passwd", "outside"), ("sub/../../x.safetensors", "outside"),
                          ("missing.safetensors", "missing"), ("", "not a file name")):
        index.write_text(json.dumps({"weight_map": {"lm_head.weight": bad}}))
        with pytest.raises((ValueError, FileNotFoundError), match=fragment):
            inspect_checkpoint(folder)
    index.write_text("{not json")
    with pytest.raises(ValueError, match="cannot read"):
        inspect_checkpoint(folder)
    index.write_text(json.dumps({"weight_map": {"lm_head.weight": "shard-1.safetensors"}}))
    assert inspect_checkpoint(folder)["model_type"] == "llama"


def test_tokenizer_with_custom_code_is_refused(checkpoints, tmp_path):
    folder = tmp_path / "tok"
    shutil.copytree(checkpoints["good"], folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="custom code"):
        load_tokenizer(folder)
    assert load_tokenizer(checkpoints["good"]).encode("w1 w2")


@pytest.mark.parametrize("device", ["foo", "meta", "cuda:99", "mps", 3])
def test_devices_outside_cpu_and_cuda_are_refused(device):
    if device == "cuda:99" and torch.cuda.is_available() and torch.cuda.device_count() > 99:
        pytest.skip("a machine with 100 GPUs")
    with pytest.raises((ValueError, TypeError), match="device"):
        resolve_device(device)
    with pytest.raises(ValueError, match="dtype"):
        resolve_dtype("int8", torch.device("cpu"))
