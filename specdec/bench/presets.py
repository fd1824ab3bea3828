"""The benchmark presets: which models, prompts and configurations a `specdec bench` run measures.

- `smoke`   CPU, tiny random Llamas, well under a minute: checks the whole report end to end. The model
            drafter is a slightly perturbed copy of the target (so α is high), not a small model.
- `gpu`     the zoo's `gpu` code pair (≥300M 24-layer target, ~100× smaller 2-layer drafter): loaded from
            `--pair DIR` or trained first with `specdec.zoo` from `--data DIR`; bf16, batch 1 and 8.
- `system`  production shape: an 8B-shaped Llama (random bf16 weights) and a small-shape drafter.
            Acceptance is SYNTHETIC (each draft accepted with a fixed probability α; benchmark only) to
            time the engine against Thm 3.8 at α ∈ {0.6, 0.8, 0.9}; plus the MBU of plain decoding.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import torch

from specdec.bench.runner import BenchSetup
from specdec.fast import FastDrafter, FastLlama, FastTarget, LlamaShape

logger = logging.getLogger(__name__)

SYSTEM_TARGET = LlamaShape(vocab_size=128256, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128,
                           intermediate_size=14336, rms_norm_eps=1e-5, rope_theta=500000.0)
SYSTEM_DRAFT = LlamaShape(vocab_size=128256, dim=1024, n_layers=2, n_heads=16, n_kv_heads=8, head_dim=64,
                          intermediate_size=2816, rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True)


def _hf_weight_bytes(model: torch.nn.Module) -> int:
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel() * p.element_size()
    return total


def motif_prompts(vocab: int, count: int, length: int, seed: int) -> list[list[int]]:
    """Random prompts with repeats (a motif copied several times), so prompt lookup finds matches."""
    gen = torch.Generator().manual_seed(seed)
    prompts = []
    for _ in range(count):
        motif = torch.randint(3, vocab, (8,), generator=gen).tolist()
        row = (motif * (length // 8 + 1))[:length]
        for i in torch.randint(0, length, (length // 8,), generator=gen).tolist():
            row[i] = int(torch.randint(3, vocab, (1,), generator=gen))
        prompts.append(row)
    return prompts


def smoke(device: torch.device, max_new_tokens: int = 16) -> BenchSetup:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    target = LlamaForCausalLM(cfg).eval().to(device)
    draft = copy.deepcopy(target)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(1)
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=gen).to(device) * 0.003)
    for model in (target, draft):
        model.generation_config.eos_token_id = None
    prompts = motif_prompts(256, 8, 32, seed=2)
    setup = BenchSetup(
        name="smoke", device=device,
        target=FastTarget(target, max_draft_tokens=4), drafter=FastDrafter(draft, max_draft_tokens=4),
        prompts=prompts, max_new_tokens=max_new_tokens, gamma=3, batch_sizes=(1, 4), gamma_sweep=(2, 4),
        repeats=1, hf_target=target, hf_draft=draft, hf_repeats=1,
        fit_corpus=motif_prompts(256, 64, 64, seed=3), guarded_batch=4, b1_prompts=2,
    )
    setup.weight_bytes = {"target": setup.target.model.weight_bytes, "draft": setup.drafter.model.weight_bytes,
                          "hf_target": _hf_weight_bytes(target), "hf_draft": _hf_weight_bytes(draft)}
    setup.notes.append("smoke: tiny random Llamas on CPU; the model drafter is a perturbed copy of the target "
                       "(α high, c ≈ 1): a check of the harness, not a speed claim")
    return setup


def load_pair(pair_dir: Path, device: torch.device, dtype: torch.dtype, allow_pickle: bool = False):
    """A trained pair from local folders only (`specdec.loading`: no hub, no remote code, safetensors)."""
    from specdec.loading import load_model

    pair_dir = Path(pair_dir)
    if not pair_dir.is_dir():
        raise FileNotFoundError(f"--pair folder not found: {pair_dir} (a trained zoo pair with target/ and draft0/)")
    target = load_model(pair_dir / "target", device=device, dtype=dtype, what="pair target", allow_pickle=allow_pickle)
    draft_dir = pair_dir / "draft0" if (pair_dir / "draft0").is_dir() else pair_dir / "draft"
    draft = load_model(draft_dir, device=device, dtype=dtype, what="pair draft", allow_pickle=allow_pickle)
    return target, draft


def train_gpu_pair(data_dir: Path, out_dir: Path, budget_scale: float, device: torch.device,
                   preset: str = "gpu") -> dict:
    """Train a zoo preset (default `gpu`; scaled time budget) into out_dir; returns the zoo summary."""
    try:
        from specdec.zoo.pipeline import train_pair
        from specdec.zoo.presets import get_preset, scale_budget
    except ImportError as err:  # pragma: no cover - the zoo is optional
        raise ValueError(f"the model zoo (specdec.zoo) is not available to train the gpu pair: {err}") from err
    return train_pair(scale_budget(get_preset(preset), budget_scale), data_dir, out_dir, device=device, progress=False)


def gpu(device: torch.device, *, pair_dir: Path | None, data_dir: Path | None, max_new_tokens: int = 128,
        prompt_len: int = 128, gamma: int = 4, repeats: int = 3, allow_pickle: bool = False) -> BenchSetup:
    if pair_dir is None:
        raise ValueError("--preset gpu needs --pair DIR (a trained zoo pair) or --data DIR with --train")
    dtype = torch.bfloat16
    if str(pair_dir) == "random":
        hf_target, hf_draft = random_zoo_pair(device, dtype)
    else:
        hf_target, hf_draft = load_pair(pair_dir, device, dtype, allow_pickle)
    for model in (hf_target, hf_draft):
        model.generation_config.eos_token_id = None
    target = FastTarget(hf_target, dtype=dtype, max_draft_tokens=8)
    drafter = FastDrafter(hf_draft, dtype=dtype, max_draft_tokens=8)
    if data_dir is None and str(pair_dir) == "random":
        prompts = motif_prompts(hf_target.config.vocab_size, 8, prompt_len, seed=2)
        corpus = motif_prompts(hf_target.config.vocab_size, 64, 512, seed=3)
    else:
        prompts, corpus = _code_prompts(data_dir, prompt_len, count=8)
    setup = BenchSetup(
        name="gpu", device=device, target=target, drafter=drafter, prompts=prompts, max_new_tokens=max_new_tokens,
        gamma=gamma, repeats=repeats, hf_target=hf_target, hf_draft=hf_draft, hf_repeats=1, fit_corpus=corpus,
        b1_prompts=4,
    )
    setup.weight_bytes = {"target": target.model.weight_bytes, "draft": drafter.model.weight_bytes,
                          "hf_target": _hf_weight_bytes(hf_target), "hf_draft": _hf_weight_bytes(hf_draft)}
    if str(pair_dir) == "random":
        setup.notes.append("gpu --pair random: the zoo gpu SHAPES with random weights (timings only; α is meaningless)")
    return setup


def random_zoo_pair(device: torch.device, dtype: torch.dtype, vocab_size: int = 8192):
    from specdec.zoo.presets import get_preset
    from specdec.zoo.models import build_model

    preset = get_preset("gpu")
    target = build_model(preset.target, vocab_size, seed=0).to(device=device, dtype=dtype).eval()
    draft = build_model(preset.drafts[0].shape, vocab_size, seed=1).to(device=device, dtype=dtype).eval()
    return target, draft


def _code_prompts(data_dir: Path | None, prompt_len: int, count: int) -> tuple[list[list[int]], list[list[int]]]:
    """Prompts: windows of the code corpus' validation split; the bigram is fitted on its training split."""
    if data_dir is None:
        raise ValueError("--preset gpu needs --data DIR (a prepared code corpus) for its prompts")
    from specdec.zoo.data import TokenData

    data = TokenData.load(data_dir)
    stride = max((len(data.val) - prompt_len) // count, prompt_len)
    prompts = [data.val[i * stride : i * stride + prompt_len].astype("int64").tolist() for i in range(count)]
    corpus = [data.train[: 4_000_000].astype("int64").tolist()]
    return prompts, corpus


def system(device: torch.device, *, max_new_tokens: int = 128, prompt_len: int = 128, repeats: int = 2,
           alphas: tuple[float, ...] = (0.6, 0.8, 0.9), gammas: tuple[int, ...] = (2, 4, 8)) -> BenchSetup:
    if device.type != "cuda":
        raise ValueError("--preset system needs a CUDA device (an 8B-shaped model in bf16 is 16 GB)")
    target = FastTarget(FastLlama.random(SYSTEM_TARGET, device=device, dtype=torch.bfloat16, seed=0),
                        max_draft_tokens=max(gammas))
    drafter = FastDrafter(FastLlama.random(SYSTEM_DRAFT, device=device, dtype=torch.bfloat16, seed=1),
                          max_draft_tokens=max(gammas))
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, SYSTEM_TARGET.vocab_size, (8, prompt_len), generator=gen).tolist()
    setup = BenchSetup(
        name="system", device=device, target=target, drafter=drafter, prompts=prompts, max_new_tokens=max_new_tokens,
        gamma=4, temperatures=(0.0,), drafter_kinds=(), loop_kinds=("none",), gamma_sweep=(), repeats=repeats,
        synthetic_alphas=alphas, synthetic_gammas=gammas, guarded_batch=None,
    )
    setup.weight_bytes = {"target": target.model.weight_bytes, "draft": drafter.model.weight_bytes}
    setup.notes.append("system: 8B-shaped Llama target (random bf16 weights: hidden 4096, 32 layers, 32 heads, 8 KV heads, "
                       "intermediate 14336, vocab 128256) and a 2-layer dim-1024 drafter (random weights)")
    setup.notes.append("rows marked SYNTHETIC accept each draft with a fixed probability α instead of the rule "
                       "(benchmark only: their output is not the target's); they time the engine at that α")
    return setup
