"""Reference implementations the tests compare against."""

from __future__ import annotations

import pytest
import torch

from specdec.core import VerifyResult
from specdec.drafters.hierarchical import HierarchicalDrafter

RAGGED_PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12], [3, 4, 5], [7, 7, 7, 7, 8, 9, 7, 7, 7, 7, 8]]


def right_padded(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged prompts as (tokens `[B, W]` right-padded with 0, valid `[B, W]` bool), W the longest prompt."""
    width = max(len(p) for p in prompts)
    tokens = torch.zeros(len(prompts), width, dtype=torch.long)
    valid = torch.zeros(len(prompts), width, dtype=torch.bool)
    for b, p in enumerate(prompts):
        tokens[b, : len(p)] = torch.tensor(p)
        valid[b, : len(p)] = True
    return tokens, valid


def hf_greedy(model, prompt: list[int], max_new_tokens: int, eos: list[int]) -> list[int]:
    """transformers' own greedy generate for one prompt, cut after the first EOS."""
    device = model.device
    out = model.generate(
        torch.tensor([prompt], device=device), attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=device),
        do_sample=False,
        max_new_tokens=max_new_tokens, pad_token_id=0, eos_token_id=eos or None,
    )[0, len(prompt):].tolist()
    for i, tok in enumerate(out):
        if tok in eos:
            return out[: i + 1]
    return out


def hf_beams(model, prompt: tuple, w: int, eos: tuple, max_new_tokens: int, length_penalty: float = 1.0,
             early_stopping=False) -> tuple[list[list[int]], list[float] | None]:
    """transformers' `generate(num_beams=w, do_sample=False, num_return_sequences=w)` → (the w beams' generated
    tokens, best first; sequences_scores, None for w = 1 — greedy search)."""
    out = model.generate(
        torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long), do_sample=False,
        num_beams=w, num_return_sequences=w, max_new_tokens=max_new_tokens, pad_token_id=0,
        eos_token_id=list(eos) or None, output_scores=True, return_dict_in_generate=True,
        length_penalty=length_penalty, early_stopping=early_stopping,
    )
    if w == 1:
        return [out.sequences[0, len(prompt):].tolist()], None
    lengths = (out.beam_indices >= 0).sum(1)
    beams = [out.sequences[j, len(prompt) : len(prompt) + int(lengths[j])].tolist() for j in range(w)]
    return beams, out.sequences_scores.tolist()


def perturbed_copy(model, scale: float = 0.1, seed: int = 0):
    """A copy of `model` with every weight moved by `scale` of its mean size: a drafter that agrees often, not always."""
    import copy

    draft = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale * p.abs().mean())
    return draft


def assert_same_greedy(model, prompt: list[int], ours: list[int], ref: list[int], tie: float = 1e-4) -> None:
    """Token equality; where they first differ, the target's top-2 logit margin must be a float tie (< `tie`)."""
    if ours == ref:
        return
    i = next((j for j, (a, b) in enumerate(zip(ours, ref)) if a != b), min(len(ours), len(ref)))
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ref[:i]], device=model.device)).logits[0, -1].float()
    top2 = logits.topk(2).values
    margin = float(top2[0] - top2[1])
    assert margin < tie, f"outputs differ at token {i} with a clear margin {margin}: ours={ours} ref={ref}"


WORDS = [f"w{i}" for i in range(60)]


def save_tiny_checkpoint(path, seed: int, layers: int = 2) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {word: i for i, word in enumerate(WORDS + ["[UNK]", "[PAD]", "[BOS]", "[EOS]"])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", bos_token="[BOS]", eos_token="[EOS]"
    )
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, pad_token_id=vocab["[PAD]"],
        bos_token_id=vocab["[BOS]"], eos_token_id=vocab["[EOS]"],
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(10.0)  # peaked logits: a random model otherwise drafts near-uniform noise
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)



class UnverifiedHierarchicalDrafter(HierarchicalDrafter):
    """Negative control: keeps the inner drafts without the middle model's accept test, still reporting M_m's q."""

    def _verify(self, inner, logits, sampling, generator):
        result, probs = super()._verify(inner, logits, sampling, generator)
        accept_all = torch.full_like(result.num_accepted, inner.tokens.shape[1])
        return VerifyResult(accept_all, result.next_token, result.beta), probs


def save_tiny_pair(root):
    """A tiny random target (2 layers, seed 0) and drafter (1 layer, seed 1) saved as root/target and root/draft."""
    save_tiny_checkpoint(root / "target", seed=0, layers=2)
    save_tiny_checkpoint(root / "draft", seed=1, layers=1)
    return root


def run_main(path, argv: list[str], monkeypatch) -> None:
    """Run the script at `path` as `__main__` with `argv` (its folder first on the path); a SystemExit must be a
    success (0 or None)."""
    import runpy
    import sys

    monkeypatch.setattr(sys, "argv", [str(path), *argv])
    monkeypatch.syspath_prepend(str(path.parent))
    try:
        runpy.run_path(str(path), run_name="__main__")
    except SystemExit as stop:
        assert stop.code in (0, None), f"{path.name} exited with {stop.code}"


def engine_hierarchy_proposals(target, drafter, monkeypatch, prompts, texts, new: int) -> list[tuple[list, list]]:
    """(committed text, drafts) of every proposal `drafter` (a `HierarchicalDrafter`) makes on the engine, one greedy
    request at a time (batch 1: no padding rows; a hierarchy nested inside it is not recorded); each request's text
    is checked against `texts` (the target's verification keeps it, whatever is drafted)."""
    from specdec.engine import Engine, EngineConfig
    from specdec.engine.hierarchy import EngineHierarchy
    from specdec.request import SamplingParams

    seen, real = [], EngineHierarchy.propose

    def spy(self, context, gamma):
        proposal = real(self, context, gamma)
        if self.drafter is drafter:
            n = int(context.lengths[0])
            seen.append((context.tokens[0, :n].tolist(), proposal.tokens[0].tolist()))
        return proposal

    monkeypatch.setattr(EngineHierarchy, "propose", spy)
    for prompt, want in zip(prompts, texts):
        engine = Engine(target, drafter, EngineConfig(max_batch_size=1, max_seq_len=64, num_draft_tokens=3,
                                                      cuda_graphs=False))
        rid, out = engine.add_request(prompt, SamplingParams(temperature=0, max_new_tokens=new)), []
        while engine.has_unfinished():
            out += [t for o in engine.step() if o.request_id == rid for t in o.new_token_ids]
        assert out == want
    return seen


def accepting_unverified(real):
    """Negative control: `verify_greedy` (`real`) that accepts every inner draft, whatever the middle model scored."""
    from dataclasses import replace

    def unverified(drafts, logits, draft_lengths=None, **kw):
        result = real(drafts, logits, draft_lengths=draft_lengths, **kw)
        width = drafts.shape[1]
        return replace(result, num_accepted=result.num_accepted * 0 + width if draft_lengths is None else
                       draft_lengths.clamp(max=width))

    return unverified
