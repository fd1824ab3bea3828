"""FP8 / GPTQ / AWQ checkpoints into the engine (`loading.quantized`, through `engine.build`): a tiny Llama's tensors
written as each format lays them out (the reference packers) into a safetensors folder, or a transformers model
whose linears are transformers' own FP8Linear modules, load into a `FastLlama` whose linear weights stay quantized,
and its greedy tokens on the CPU engine equal the transformers model's with the dequantized weights put back.
Refusals (act-order, other bit widths, other formats, bitwise on the CPU) are checked, each naming what it refuses.
"""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
from safetensors.torch import save_file  # noqa: E402

from specdec.engine import Engine, EngineConfig  # noqa: E402
from specdec.engine.build import _fast_model, build_model  # noqa: E402
from specdec.engine.config import UnsupportedModel  # noqa: E402
from specdec.fast.model import FastLlama  # noqa: E402
from specdec.fast.quant import pack  # noqa: E402
from specdec.loading.quantized import load_quantized  # noqa: E402
from specdec.request import SamplingParams  # noqa: E402

PROJ = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
        "mlp.up_proj", "mlp.down_proj")
QCONFIGS = {
    "gptq": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": False,
             "checkpoint_format": "gptq"},
    "awq": {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm", "zero_point": True},
    "fp8": {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
    "compressed-tensors": {"quant_method": "compressed-tensors", "format": "float-quantized",
                           "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float",
                                                                     "strategy": "channel"}}}},
}


def tiny_llama(seed: int = 0):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                      tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.05)
    return model


def write_checkpoint(model, fmt: str, folder):
    """The model's linears as `fmt` stores them (the LM head too, where the format quantizes it); the model's own
    linear weights are replaced by the dequantized ones (the reference)."""
    from specdec.fast.quant.fp8 import Fp8Weight
    from specdec.fast.quant.int4 import from_awq, from_gptq

    tensors = {}
    params = dict(model.named_parameters())
    for i in range(model.config.num_hidden_layers):
        for proj in PROJ:
            name = f"model.layers.{i}.{proj}"
            w = params[name + ".weight"]
            if fmt in ("gptq", "awq"):
                q, z, s = pack.quantize_int4(w, 128)
                if fmt == "gptq":
                    qweight, qzeros, scales, g_idx = pack.pack_gptq(q, z, s)
                    tensors.update({name + ".g_idx": g_idx})
                    ref = from_gptq(qweight, qzeros, scales, g_idx)
                else:
                    qweight, qzeros, scales = pack.pack_awq(q, z, s)
                    ref = from_awq(qweight, qzeros, scales)
                tensors.update({name + ".qweight": qweight, name + ".qzeros": qzeros, name + ".scales": scales})
            else:
                e, scale = pack.quantize_fp8(w, "block" if fmt == "fp8" else "channel")
                tensors.update({name + ".weight": e, name + (".weight_scale_inv" if fmt == "fp8" else ".weight_scale"):
                                scale})
                ref = Fp8Weight.from_checkpoint(e, scale)
            with torch.no_grad():
                w.copy_(ref.dequantize())
    for name, p in params.items():
        if not any(proj in name for proj in PROJ):
            tensors[name] = p.detach().clone().contiguous()
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"))
    config = model.config.to_dict()
    config["quantization_config"] = QCONFIGS[fmt]
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def greedy(model) -> list:
    engine = Engine(model, None, EngineConfig(max_batch_size=2, max_seq_len=64, num_draft_tokens=0))
    ids = [engine.add_request(p, SamplingParams(temperature=0, max_new_tokens=12)) for p in ([5, 6, 7], [8, 9])]
    tokens = {i: [] for i in ids}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
    return [tokens[i] for i in ids]


@pytest.mark.parametrize("fmt", ["gptq", "awq", "fp8", "compressed-tensors"])
def test_folder_loads_quantized_and_matches_dequantized(tmp_path, fmt, caplog):
    hf = tiny_llama()
    folder = write_checkpoint(hf, fmt, tmp_path / fmt)
    with caplog.at_level("INFO", logger="specdec.loading.quantized"):
        routed = _fast_model(str(folder))  # (the engine's own route: on CUDA where there is one)
    assert isinstance(routed, FastLlama) and all(p.is_meta for p in routed.wqkv)
    line = [r.getMessage() for r in caplog.records if "kept quantized" in r.getMessage()]
    assert len(line) == 1 and ("int4" in line[0] or "e4m3" in line[0]) and ("reference" in line[0] or "Triton" in line[0])
    fast = load_quantized(str(folder), device="cpu")
    assert greedy(fast) == greedy(FastLlama.from_hf(hf))


def test_transformers_fp8_modules_load_quantized():
    from transformers.integrations.finegrained_fp8 import FP8Linear

    hf = tiny_llama(1)
    for i, layer in enumerate(hf.model.layers):
        for proj in PROJ:
            parent, attr = proj.split(".")
            dense = getattr(getattr(layer, parent), attr)
            module = FP8Linear(dense.in_features, dense.out_features, block_size=(128, 128))
            e, scale = pack.quantize_fp8(dense.weight, "block")
            module.weight.data, module.weight_scale_inv.data = e, scale
            setattr(getattr(layer, parent), attr, module)
    hf.config.quantization_config = QCONFIGS["fp8"]
    fast = load_quantized(hf, device="cpu")
    assert all(p.is_meta for p in fast.w_down) and isinstance(_fast_model(hf), FastLlama)
    reference = tiny_llama(1)  # the same weights, dequantized
    with torch.no_grad():
        for layer, ref in zip(hf.model.layers, reference.model.layers):
            for proj in PROJ:
                parent, attr = proj.split(".")
                m = getattr(getattr(layer, parent), attr)
                getattr(getattr(ref, parent), attr).weight.copy_(
                    fast.wqkv[0].specdec_quant.__class__.from_checkpoint(m.weight, m.weight_scale_inv).dequantize())
    assert greedy(fast) == greedy(FastLlama.from_hf(reference))


@pytest.mark.parametrize("change, message", [({"desc_act": True}, "act-order"), ({"bits": 8}, "8 bits"),
                                             ({"quant_method": "bitnet"}, "bitnet")])
def test_refusals_name_the_option(tmp_path, change, message):
    folder = write_checkpoint(tiny_llama(), "gptq", tmp_path / "q")
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"].update(change)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModel, match=message):
        _fast_model(str(folder), check_only=True)


def test_bitwise_refused_on_cpu(tmp_path):
    folder = write_checkpoint(tiny_llama(), "awq", tmp_path / "q")
    with pytest.raises(ValueError, match="bitwise=True covers FP8 / int4 weights on CUDA only"):
        build_model(load_quantized(str(folder), device="cpu"), bitwise=True)
