"""Published drafter formats (`specdec.drafters.formats`): random-weight checkpoints written in each reference
layout load, and compute what an independent forward built from transformers' Llama modules computes over the
same tensors (EAGLE-1/2, EAGLE-3, speculators eagle3, Medusa, vLLM Medusa); refusals are one line naming the
problem."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from drafters import format_checkpoints as fc
from specdec.drafters.formats import DrafterFolder, detect_format, drafter_folder, is_drafter, load_drafter
from specdec.fast.eagle import EagleHead
from specdec.fast.medusa import MedusaHeads
from specdec.fast.model import FastLlama

DRAFT_IDS = [0, 2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 63]  # a 20-token draft vocabulary
TOKENS = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 3, 4, 60, 1]])


@pytest.fixture(scope="module")
def target(make_llama):
    return make_llama(0, layers=8)  # EAGLE-3's default layers 2, L//2, L−3 are distinct from 7 layers up


@pytest.fixture(scope="module")
def fast(target):
    return FastLlama.from_hf(target, kernels="reference")


@pytest.fixture(scope="module")
def states(target):
    """The target's residual stream entering each layer (hidden_states[i], i < L) and its final-normed states."""
    with torch.no_grad():
        return target(TOKENS, output_hidden_states=True).hidden_states


def _head_logits(head, features, tokens):
    cache = head.layer.new_cache(1, 64)
    with torch.no_grad():
        return head.logits(head(features, tokens, cache))


def test_eagle1_matches_the_reference_forward(tmp_path, target, fast, states):
    folder = fc.write_eagle1(tmp_path / "eagle", target)
    assert detect_format(folder) == "eagle" and is_drafter(str(folder))
    head = load_drafter(str(folder), fast)
    assert isinstance(head, EagleHead) and head.config.fc_bias and head.feature_layers is None
    assert not head.config.own_embedding  # the checkpoint's embed_tokens is the target's: shared, not copied
    state = load_file(str(folder / "model.safetensors"))
    features, nxt = states[-1][:, :-1], TOKENS[:, 1:]
    torch.testing.assert_close(_head_logits(head, features, nxt), fc.reference_eagle1(target, state, features, nxt))


def test_eagle1_without_bias_and_with_its_own_embedding(tmp_path, target, fast, states):
    folder = fc.write_eagle1(tmp_path / "eagle", target, fc_bias=False)
    state = load_file(str(folder / "model.safetensors"))
    state["embed_tokens.weight"] = state["embed_tokens.weight"] + 0.1  # trained with another embedding
    save_file(state, str(folder / "model.safetensors"))
    head = load_drafter(str(folder), fast)
    assert not head.config.fc_bias and head.config.own_embedding
    other = fc.reference_eagle1(target, state, states[-1][:, :-1], TOKENS[:, 1:])  # (uses the target's embedding)
    mine = _head_logits(head, states[-1][:, :-1], TOKENS[:, 1:])
    assert not torch.allclose(mine, other)  # the head's own embedding is what it reads
    with torch.no_grad():
        target.model.embed_tokens.weight.add_(0.1)
        try:
            torch.testing.assert_close(mine, fc.reference_eagle1(target, state, states[-1][:, :-1], TOKENS[:, 1:]))
        finally:
            target.model.embed_tokens.weight.sub_(0.1)


def test_eagle3_matches_the_reference_forward_with_its_draft_vocabulary(tmp_path, target, fast, states):
    folder = fc.write_eagle3(tmp_path / "eagle3", target, DRAFT_IDS)
    assert detect_format(folder) == "eagle3"
    head = load_drafter(str(folder), fast)
    assert head.feature_layers == (2, 4, 5) and head.feature_dim == 3 * 32
    aux = torch.cat([states[2], states[4], states[5]], -1)[:, :-1]
    mine = _head_logits(head, aux, TOKENS[:, 1:])
    ref = fc.reference_eagle3(target, load_file(str(folder / "model.safetensors")), aux, TOKENS[:, 1:], "midlayer.")
    outside = torch.ones(64, dtype=torch.bool)
    outside[DRAFT_IDS] = False
    assert torch.isinf(mine[..., outside]).all() and torch.isfinite(mine[..., DRAFT_IDS]).all()
    torch.testing.assert_close(mine[..., DRAFT_IDS], ref[..., DRAFT_IDS])
    q = torch.softmax(mine, -1)
    assert (q[..., outside] == 0).all()  # q lives on the draft vocabulary, mapped into the target's


def test_target_keeps_the_layers_eagle3_reads(fast, states):
    """`FastLlama.feature_layers`: the residual stream entering those layers, concatenated in layer order."""
    fast.feature_layers = (1, 3, 6)
    try:
        with torch.no_grad():
            _, aux = fast(TOKENS, fast.new_cache(1, 32), return_hidden=True)
            _, last = fast(TOKENS, fast.new_cache(1, 32), return_hidden=True, last_only=True)
    finally:
        fast.feature_layers = None
    expected = torch.cat([states[1], states[3], states[6]], -1)
    torch.testing.assert_close(aux, expected)
    torch.testing.assert_close(last, expected[:, -1:])


def test_speculators_eagle3_matches_the_reference_forward(tmp_path, target, fast, states):
    folder = fc.write_speculators_eagle3(tmp_path / "spec", target, DRAFT_IDS, layers=[6, 1, 3])
    assert detect_format(folder) == "speculators"
    head = load_drafter(str(folder), fast)
    assert head.feature_layers == (1, 3, 6) and head.config.norm_before_residual
    aux = torch.cat([states[1], states[3], states[6]], -1)[:, :-1]
    mine = _head_logits(head, aux, TOKENS[:, 1:])
    ref = fc.reference_eagle3(target, load_file(str(folder / "model.safetensors")), aux, TOKENS[:, 1:], "layers.0.",
                              norm_before_residual=True)
    torch.testing.assert_close(mine[..., DRAFT_IDS], ref[..., DRAFT_IDS])


@pytest.mark.parametrize("vllm", [False, True])
def test_medusa_matches_the_reference_heads(tmp_path, target, fast, states, vllm):
    final = states[-1][0]  # [k, d]
    if vllm:
        token_map = list(range(0, 64, 2))
        folder = fc.write_vllm_medusa(tmp_path / "medusa", target, token_map)
        heads = [(w, None, lm[token_map]) for w, _, lm in fc.medusa_tensors(target, 2, 0)]
    else:
        token_map = list(range(64))
        folder = fc.write_medusa(tmp_path / "medusa", target, num_heads=3)
        heads = fc.medusa_tensors(target, 3, 0)
    assert detect_format(folder) == "medusa"
    module = load_drafter(str(folder), fast)
    assert isinstance(module, MedusaHeads) and module.config.num_heads == len(heads)
    with torch.no_grad():
        mine = module(final)
    torch.testing.assert_close(mine[..., token_map], fc.reference_medusa(heads, final))
    if vllm:
        assert torch.isinf(mine[..., 1::2]).all()


def test_a_model_folder_is_no_drafter_format(ckpt, make_llama, tmp_path):
    assert detect_format(ckpt / "target") is None and not is_drafter(str(ckpt / "target"))
    assert detect_format(ckpt / "missing") is None and drafter_folder(ckpt / "target") is None
    model = make_llama(1, layers=1)  # a 1-layer model with pickled weights, like EAGLE's own heads ship
    model.config.save_pretrained(tmp_path / "pickled")
    torch.save(model.state_dict(), tmp_path / "pickled" / "pytorch_model.bin")
    assert detect_format(tmp_path / "pickled") is None  # its pickle's names (read, never executed) are a model's


def test_pickled_weights_need_allow_pickle(tmp_path, target, fast, states):
    folder = fc.write_eagle1(tmp_path / "eagle", target, weights="pytorch_model.bin")
    assert detect_format(folder) == "eagle"  # EAGLE's own heads ship as pytorch_model.bin
    with pytest.raises(ValueError, match="pickled \\(pytorch_model.bin\\).*allow_pickle=True"):
        load_drafter(str(folder), fast)
    head = load_drafter(str(folder), fast, allow_pickle=True)
    assert drafter_folder(folder, allow_pickle=True) == DrafterFolder(str(folder), True)
    assert load_drafter(DrafterFolder(str(folder), True), fast).config == head.config
    state = torch.load(folder / "pytorch_model.bin", weights_only=True)
    torch.testing.assert_close(_head_logits(head, states[-1][:, :-1], TOKENS[:, 1:]),
                               fc.reference_eagle1(target, state, states[-1][:, :-1], TOKENS[:, 1:]))


def test_mismatched_targets_are_refused_naming_both_numbers(tmp_path, target, make_llama):
    wide = FastLlama.from_hf(make_llama(0, layers=8, hidden=48), kernels="reference")
    other_vocab = FastLlama.from_hf(make_llama(0, layers=8, vocab=80), kernels="reference")
    shallow = FastLlama.from_hf(make_llama(0, layers=4), kernels="reference")
    eagle = fc.write_eagle1(tmp_path / "eagle", target)
    eagle3 = fc.write_eagle3(tmp_path / "eagle3", target, DRAFT_IDS)
    medusa = fc.write_medusa(tmp_path / "medusa", target)
    with pytest.raises(ValueError, match="hidden size 32 and vocabulary 64; this target has hidden size 48"):
        load_drafter(str(eagle), wide)
    with pytest.raises(ValueError, match="vocabulary 64; this target has hidden size 32 and vocabulary 80"):
        load_drafter(str(eagle3), other_vocab)
    with pytest.raises(ValueError, match="target layers \\[2, 2, 1\\]; they must be distinct"):
        load_drafter(str(eagle3), shallow)
    with pytest.raises(ValueError, match="Medusa heads for a target of hidden size 32 and vocabulary 64; this target has hidden size 48"):
        load_drafter(str(medusa), wide)


def test_broken_checkpoints_are_refused_in_one_line(tmp_path, target, fast):
    folder = fc.write_eagle3(tmp_path / "eagle3", target, DRAFT_IDS)
    state = load_file(str(folder / "model.safetensors"))
    save_file(dict(state, d2t=-torch.arange(20)), str(folder / "model.safetensors"))  # every draft id → target id 0
    with pytest.raises(ValueError, match="d2t must map the 20 draft ids to distinct target ids in \\[0, 64\\)"):
        load_drafter(str(folder), fast)
    save_file(dict(state, d2t=state["d2t"] * 0), str(folder / "model.safetensors"))  # ids 0..19: not what t2d marks
    with pytest.raises(ValueError, match="t2d does not mark exactly the target ids d2t maps to"):
        load_drafter(str(folder), fast)
    del state["midlayer.hidden_norm.weight"]
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match="missing tensors \\['layer.hidden_norm'\\]"):
        load_drafter(str(folder), fast)
    state["midlayer.hidden_norm.weight"] = torch.ones(32)
    state["midlayer.extra.weight"] = torch.ones(3)
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match="unexpected tensors for this format: \\['midlayer.extra.weight'\\]"):
        load_drafter(str(folder), fast)
    spec = fc.write_speculators_eagle3(tmp_path / "spec", target, DRAFT_IDS, layers=[1, 3, 6])
    config = json.loads((spec / "config.json").read_text())
    (spec / "config.json").write_text(json.dumps(dict(config, speculators_model_type="mtp")))
    with pytest.raises(ValueError, match="speculators_model_type 'mtp' is not supported \\(eagle, eagle3\\)"):
        load_drafter(str(spec), fast)
    with pytest.raises(ValueError, match="is not a drafter folder in a known format"):
        load_drafter(str(tmp_path), fast)


def test_speculators_eagle_and_medusa2_layouts(tmp_path, target, fast, states):
    """speculators' legacy "eagle" names (fusion_fc, transformer.*) and a Medusa-2 folder (the base model's tensors
    beside medusa_head.*) load as the same heads."""
    original = fc.write_eagle1(tmp_path / "eagle", target)
    state = load_file(str(original / "model.safetensors"))
    renamed = {k.replace("fc.", "fusion_fc.").replace("layers.0.", "transformer."): v for k, v in state.items()
               if k != "embed_tokens.weight"}
    folder = tmp_path / "spec"
    folder.mkdir()
    save_file(renamed, str(folder / "model.safetensors"))
    config = {"speculators_model_type": "eagle", "layernorms": False, "fusion_bias": True,
              "transformer_layer_config": fc._llama_config(target)}
    (folder / "config.json").write_text(json.dumps(config))
    assert detect_format(folder) == "speculators"
    head = load_drafter(str(folder), fast)
    features, nxt = states[-1][:, :-1], TOKENS[:, 1:]
    torch.testing.assert_close(_head_logits(head, features, nxt), fc.reference_eagle1(target, state, features, nxt))
    (folder / "config.json").write_text(json.dumps(dict(config, layernorms=True)))
    with pytest.raises(ValueError, match="layernorms=true \\(HASS\\) are not supported"):
        load_drafter(str(folder), fast)

    medusa = fc.write_medusa(tmp_path / "medusa", target, num_heads=2)
    heads = {f"medusa_head.{k}": v for k, v in load_file(str(medusa / "medusa_lm_head.safetensors")).items()}
    full = tmp_path / "medusa2"
    full.mkdir()
    base = {f"model.{k}": v.detach().clone() for k, v in target.model.state_dict().items() if "rotary" not in k}
    save_file({**base, **heads}, str(full / "model.safetensors"))
    (full / "config.json").write_text(json.dumps({**fc._llama_config(target, num_hidden_layers=8),
                                                  "medusa_num_heads": 2, "medusa_num_layers": 1}))
    module = load_drafter(str(full), fast)
    with torch.no_grad():
        torch.testing.assert_close(module(states[-1][0]),
                                   fc.reference_medusa(fc.medusa_tensors(target, 2, 0), states[-1][0]))


@pytest.mark.parametrize("flags", [dict(norm_before_fc=True, norm_output=True), dict(fc_norm=True)])
def test_speculators_norm_flags_and_drafting_on_its_own_outputs(tmp_path, target, fast, states, flags):
    """speculators' norm_before_fc (one RMSNorm over the concatenated features), fc_norm (one per feature) and
    norm_output (the next step reads norm(r), Eagle 3.1); the second draft step runs on the head's own output."""
    folder = fc.write_speculators_eagle3(tmp_path / "spec", target, DRAFT_IDS, layers=[1, 3, 6])
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **flags, "norm_before_residual": False}))
    state = load_file(str(folder / "model.safetensors"))
    gen = torch.Generator().manual_seed(5)
    if flags.get("norm_before_fc"):
        state["input_norm.weight"] = 1 + 0.2 * torch.randn(96, generator=gen)
    if flags.get("fc_norm"):
        state.update({f"fc_norm.{i}.weight": 1 + 0.2 * torch.randn(32, generator=gen) for i in range(3)})
    save_file(state, str(folder / "model.safetensors"))
    head = load_drafter(str(folder), fast)
    assert head.config.norm_output == bool(flags.get("norm_output")) and not head.config.norm_before_residual
    aux = torch.cat([states[1], states[3], states[6]], -1)[:, :-1]
    nxt, drafted = TOKENS[:, 1:], torch.tensor([[7]])
    hidden = fc.eagle3_fc(target, state, aux, flags.get("norm_before_fc", False), flags.get("fc_norm", False))
    raw, logits = fc.reference_eagle3_layer(target, state, hidden, nxt, "layers.0.")
    back = raw[:, -1:]
    if flags.get("norm_output"):
        back = torch.nn.functional.rms_norm(back, (32,), state["norm.weight"], target.config.rms_norm_eps)
    _, logits2 = fc.reference_eagle3_layer(target, state, torch.cat([hidden, back], 1), torch.cat([nxt, drafted], 1),
                                           "layers.0.")
    cache = head.layer.new_cache(1, 64)
    with torch.no_grad():
        mine = head(aux, nxt, cache)
        mine2 = head.step(mine[:, -1:], drafted, cache)
        torch.testing.assert_close(head.logits(mine)[..., DRAFT_IDS], logits[..., DRAFT_IDS])
        torch.testing.assert_close(head.logits(mine2)[0, -1, DRAFT_IDS], logits2[0, -1, DRAFT_IDS])


def test_eagle1_parts_it_does_not_have_are_refused(tmp_path, target, fast):
    folder = fc.write_eagle1(tmp_path / "eagle", target)
    state = load_file(str(folder / "model.safetensors"))
    save_file(dict(state, **{"layers.0.input_layernorm.weight": torch.ones(32)}), str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match="input_layernorm.weight is not part of an EAGLE-1 head"):
        load_drafter(str(folder), fast)
    save_file({k: v for k, v in state.items() if k != "fc.bias"}, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match="the config asks for an fc bias but the weights have none"):
        load_drafter(str(folder), fast)  # (its config.json says bias: true)
