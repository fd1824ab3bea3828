"""Hostile checkpoints, built once per session from the tiny word-level Llama of tests/helpers.py.

  good           a valid checkpoint (safetensors, tokenizer)
  evil           unknown model_type + auto_map + a modeling file that would write a marker file if run
  automap        a known model_type, but config.json asks for custom code (auto_map)
  traversal      a shard index naming ../../../etc/passwd
  truncated      model.safetensors cut in half
  corrupt        model.safetensors that is 64 bytes of 0xff
  vocab0         config.json with vocab_size 0
  pickle         pytorch_model.bin only (pickled weights)
  mistral        a Mistral with a sliding window (attention the adapters cannot roll back)
  overflow       a Llama whose lm_head overflows float16 (logits +inf when loaded in float16)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers import save_tiny_checkpoint

EVIL_CODE = "import pathlib\npathlib.Path({marker!r}).write_text('code from the checkpoint ran')\n" \
            "from transformers import LlamaConfig as EvilConfig, LlamaForCausalLM as EvilModel\n"


def _clone(good: Path, root: Path, name: str) -> Path:
    folder = root / name
    shutil.copytree(good, folder)
    return folder


def _edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    import torch
    import transformers

    root = tmp_path_factory.mktemp("hostile")
    good = root / "good"
    save_tiny_checkpoint(good, seed=0)
    out = {"good": good, "marker": root / "PWNED"}

    evil = _clone(good, root, "evil")
    _edit_config(evil, model_type="evilnet", auto_map={"AutoConfig": "modeling_evil.EvilConfig",
                                                       "AutoModelForCausalLM": "modeling_evil.EvilModel"})
    (evil / "modeling_evil.py").write_text(EVIL_CODE.format(marker=str(out["marker"])))
    out["evil"] = evil

    automap = _clone(good, root, "automap")
    _edit_config(automap, auto_map={"AutoModelForCausalLM": "modeling_evil.EvilModel"})
    (automap / "modeling_evil.py").write_text(EVIL_CODE.format(marker=str(out["marker"])))
    out["automap"] = automap

    traversal = _clone(good, root, "traversal")
    (traversal / "model.safetensors").unlink()
    (traversal / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {"lm_head.weight": "../../../etc/passwd"}}))
    out["traversal"] = traversal

    truncated = _clone(good, root, "truncated")
    data = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[: len(data) // 2])
    out["truncated"] = truncated

    corrupt = _clone(good, root, "corrupt")
    (corrupt / "model.safetensors").write_bytes(b"\xff" * 64)
    out["corrupt"] = corrupt

    vocab0 = _clone(good, root, "vocab0")
    _edit_config(vocab0, vocab_size=0)
    out["vocab0"] = vocab0

    model = transformers.AutoModelForCausalLM.from_pretrained(good)
    pickle = _clone(good, root, "pickle")
    (pickle / "model.safetensors").unlink()
    torch.save(model.state_dict(), pickle / "pytorch_model.bin")
    out["pickle"] = pickle

    overflow = _clone(good, root, "overflow")
    with torch.no_grad():
        model.lm_head.weight.mul_(3e4)  # fine in float32; +inf logits in float16
    model.save_pretrained(overflow)
    out["overflow"] = overflow

    tokenizer = transformers.AutoTokenizer.from_pretrained(good)
    config = transformers.MistralConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, sliding_window=8, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
    )
    torch.manual_seed(0)
    transformers.MistralForCausalLM(config).save_pretrained(root / "mistral")
    tokenizer.save_pretrained(root / "mistral")
    out["mistral"] = root / "mistral"
    return out
