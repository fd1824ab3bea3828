"""Presets: frozen descriptions of a target/draft pair and how long to train each part.

- `tiny`, `tiny-ende`: CPU, seconds; what the tests train.
- `demo`: the decoder-only code pair shipped in `specdec/assets/demo_pair` (see its MODEL_CARD.md).
  Shapes chosen by CPU timing (scripts/zoo_cpu_timing.py): on a 2-core CPU with HF eager models the
  per-layer Python overhead dominates, so a deep narrow target (12 layers, dim 320) against a one-layer
  drafter gives a cost ratio c ≈ 0.1 while the weights stay ≤ 40 MiB in fp16.
- `gpu`: a deep ≥300M-parameter target with a ~100× smaller shallow drafter, ~6 minutes on one H100/H200.
- `gpu-ende`: an encoder-decoder (T5) EnDe pair for the gettext corpus.

Budgets are wall-clock seconds (`max_seconds`): the loop measures its step time after a few steps and
fixes the number of steps (and so the cosine schedule) to fit, capped by `steps`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class ModelShape:
    """Architecture numbers; `arch` is "llama" (decoder-only) or "t5" (encoder-decoder)."""

    arch: str
    dim: int
    layers: int  # decoder-only: layers; t5: encoder layers = decoder layers
    heads: int
    ff: int  # MLP hidden size
    kv_heads: int | None = None  # llama only; None = heads (no grouped-query attention)
    max_len: int = 1024


@dataclass(frozen=True)
class TrainConfig:
    steps: int  # upper bound; max_seconds may lower it
    batch_size: int
    seq_len: int
    lr: float
    max_seconds: float | None = None
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    warmup_steps: int = 100
    weight_decay: float = 0.1  # on matrices only
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    z_loss: float = 1e-4  # weight of mean(logsumexp(logits)^2): keeps logits from drifting
    eval_every: int = 200
    eval_batches: int = 8
    seed: int = 0
    bf16: bool = True  # bf16 autocast on CUDA (fp32 master weights); CPU always runs fp32


@dataclass(frozen=True)
class DistillConfig:
    train: TrainConfig
    temperature: float = 1.0  # of the teacher/student softmax inside KL(p‖q)
    alpha_batches: int = 8  # held-out batches for α before/after


@dataclass(frozen=True)
class PairPreset:
    name: str
    corpus: str  # "code" | "ende"
    target: ModelShape
    drafts: tuple[ModelShape, ...]  # several candidates may be trained; all share the tokenizer
    target_train: TrainConfig
    draft_train: TrainConfig
    distill: DistillConfig | None
    export_dtype: str | None = None  # "float16" for the shipped pair; None keeps fp32
    max_shard_size: str | None = None
    description: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)


def _tiny(corpus: str) -> PairPreset:
    arch = "llama" if corpus == "code" else "t5"
    tr = TrainConfig(steps=40, batch_size=8, seq_len=64, lr=3e-3, warmup_steps=5, eval_every=20, eval_batches=2,
                     z_loss=1e-4)
    return PairPreset(
        name="tiny" if corpus == "code" else "tiny-ende",
        corpus=corpus,
        target=ModelShape(arch, dim=64, layers=2, heads=2, ff=128, max_len=256),
        drafts=(ModelShape(arch, dim=32, layers=1, heads=1, ff=64, max_len=256),),
        target_train=tr,
        draft_train=tr,
        distill=DistillConfig(replace(tr, steps=30, lr=1e-3, warmup_steps=3), alpha_batches=2),
        description="CPU smoke test: trains in seconds",
    )


PRESETS: dict[str, PairPreset] = {
    "tiny": _tiny("code"),
    "tiny-ende": _tiny("ende"),
    "demo": PairPreset(
        name="demo",
        corpus="code",
        target=ModelShape("llama", dim=320, layers=12, heads=5, ff=896, max_len=1024),
        drafts=(
            ModelShape("llama", dim=128, layers=1, heads=2, ff=384, max_len=1024),
            ModelShape("llama", dim=256, layers=1, heads=4, ff=704, max_len=1024),
        ),
        target_train=TrainConfig(steps=20_000, max_seconds=100, batch_size=64, seq_len=512, lr=2e-3,
                                 warmup_steps=150, eval_every=250, eval_batches=8),
        draft_train=TrainConfig(steps=10_000, max_seconds=20, batch_size=64, seq_len=512, lr=3e-3,
                                warmup_steps=100, eval_every=250, eval_batches=8),
        distill=DistillConfig(TrainConfig(steps=10_000, max_seconds=25, batch_size=64, seq_len=512, lr=1e-3,
                                          warmup_steps=30, min_lr_ratio=0.05, eval_every=250, eval_batches=8,
                                          z_loss=0.0)),
        export_dtype="float16",
        max_shard_size="15MB",
        description="the CPU demo pair shipped in specdec/assets/demo_pair (Python code)",
    ),
    "gpu": PairPreset(
        name="gpu",
        corpus="code",
        target=ModelShape("llama", dim=1024, layers=24, heads=16, ff=2816, max_len=1024),
        drafts=(ModelShape("llama", dim=256, layers=2, heads=4, ff=704, max_len=1024),),
        target_train=TrainConfig(steps=50_000, max_seconds=300, batch_size=32, seq_len=1024, lr=5e-4,
                                 warmup_steps=200, eval_every=200, eval_batches=8),
        draft_train=TrainConfig(steps=20_000, max_seconds=30, batch_size=64, seq_len=512, lr=3e-3,
                                warmup_steps=100, eval_every=250, eval_batches=8),
        distill=DistillConfig(TrainConfig(steps=10_000, max_seconds=30, batch_size=32, seq_len=512, lr=1e-3,
                                          warmup_steps=30, min_lr_ratio=0.05, eval_every=250, eval_batches=8,
                                          z_loss=0.0)),
        description="one H100/H200: 317M-parameter 24-layer target, 3.7M 2-layer drafter, ~6 minutes",
    ),
    "gpu-ende": PairPreset(
        name="gpu-ende",
        corpus="ende",
        target=ModelShape("t5", dim=512, layers=6, heads=8, ff=1536, max_len=128),
        drafts=(ModelShape("t5", dim=128, layers=1, heads=2, ff=384, max_len=128),),
        target_train=TrainConfig(steps=20_000, max_seconds=120, batch_size=128, seq_len=96, lr=1e-3,
                                 warmup_steps=100, eval_every=200, eval_batches=8),
        draft_train=TrainConfig(steps=20_000, max_seconds=30, batch_size=128, seq_len=96, lr=2e-3,
                                warmup_steps=100, eval_every=200, eval_batches=8),
        distill=DistillConfig(TrainConfig(steps=10_000, max_seconds=30, batch_size=128, seq_len=96, lr=1e-3,
                                          warmup_steps=30, min_lr_ratio=0.05, eval_every=200, eval_batches=8,
                                          z_loss=0.0)),
        description="encoder-decoder EnDe pair (T5) on the gettext catalogs",
    ),
}


def get_preset(name: str) -> PairPreset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}") from None


def scale_budget(preset: PairPreset, factor: float) -> PairPreset:
    """The same preset with every max_seconds multiplied by `factor` (e.g. to fit a shorter device run)."""

    def sc(tc: TrainConfig) -> TrainConfig:
        return replace(tc, max_seconds=None if tc.max_seconds is None else tc.max_seconds * factor)

    distill = None if preset.distill is None else replace(preset.distill, train=sc(preset.distill.train))
    return replace(preset, target_train=sc(preset.target_train), draft_train=sc(preset.draft_train), distill=distill)
