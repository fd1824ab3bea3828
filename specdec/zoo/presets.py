"""Presets: frozen descriptions of a target/draft pair and how long to train each part.

- `tiny`, `tiny-ende`: CPU, seconds; what the tests train.
- `demo`: the decoder-only code pair shipped in `specdec/assets/demo_pair` (see its MODEL_CARD.md).
  Shapes chosen by CPU timing (scripts/zoo_cpu_timing.py, a one-off at 26f890c): with HF eager models on a 2-core CPU a
  one-layer drafter costs c ≈ 0.1 of a deep narrow target (24 layers, dim 192), and the target's
  multi-token verification pass costs little more than a one-token pass; weights ≤ 40 MiB in fp16.
- `gpu`: a deep ≥300M-parameter target with a ~86× smaller shallow drafter, ~7 minutes on one H100/H200.
- `gpu-ende`: an encoder-decoder (T5) EnDe pair for the gettext corpus (scripts/device_run.sh ende-packages).

Budgets are wall-clock seconds (`max_seconds`): the loop measures its step time after a few steps and
fixes the number of steps (and so the cosine schedule) to fit, capped by `steps`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


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
    dropout: float = 0.0  # t5 only (dropout_rate, training only); see the gpu-ende preset


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
    compile: bool = True  # torch.compile the model and loss on CUDA (fixed-shape decoder-only batches); never on CPU
    log_every: int = 10  # on CUDA the host reads the loss every log_every steps (CPU: every step)
    # Pair corpora only: batches of at most this many padded positions (source + target, see
    # `PairData.token_batch`) instead of `batch_size` pairs. None = `batch_size` pairs per batch.
    batch_tokens: int | None = None


@dataclass(frozen=True)
class DistillConfig:
    train: TrainConfig
    temperature: float = 1.0  # of the teacher/student softmax inside KL(p‖q)
    alpha_batches: int = 8  # held-out batches for α before/after
    # Fraction of each batch drawn from text the target generated greedily (from corpus prompts), the
    # text a greedy demo decodes; the rest is corpus text. 0 = corpus only.
    generated_fraction: float = 0.0
    loss: str = "kl"  # "kl": KL(p‖q) with the target's logits; "ce": cross-entropy on the batch text


@dataclass(frozen=True)
class GeneratedPool:
    """Greedy target continuations of corpus prompts, made once per pair for distillation and for α."""

    prompt_len: int = 64
    new_tokens: int = 192
    batch_size: int = 256
    max_seconds: float = 20.0  # training pool; stops after the batch that crosses it
    val_sequences: int = 64  # held-out prompts (validation split) for α on generated text


@dataclass(frozen=True)
class DraftRecipe:
    """How one drafter is made: `init` "scratch" (random) or "target" (copy the target's embeddings,
    first layer(s) and final norm, when the shapes allow), then optional CE pre-training, then distillation."""

    shape: ModelShape
    init: str = "scratch"
    pretrain: TrainConfig | None = None
    distill: DistillConfig | None = None


@dataclass(frozen=True)
class PairPreset:
    name: str
    corpus: str  # "code" | "ende"
    target: ModelShape
    target_train: TrainConfig
    drafts: tuple[DraftRecipe, ...]  # several candidates may be trained; all share the tokenizer
    pool: GeneratedPool | None = None  # needed when a distillation uses generated text
    export_dtype: str | None = None  # "float16" for the shipped pair; None keeps fp32
    max_shard_size: str | None = None
    description: str = ""


def _tiny(corpus: str) -> PairPreset:
    arch = "llama" if corpus == "code" else "t5"
    tr = TrainConfig(steps=40, batch_size=8, seq_len=64, lr=3e-3, warmup_steps=5, eval_every=20, eval_batches=2,
                     z_loss=1e-4)
    distill = DistillConfig(replace(tr, steps=30, lr=1e-3, warmup_steps=3), alpha_batches=2)
    return PairPreset(
        name="tiny" if corpus == "code" else "tiny-ende",
        corpus=corpus,
        target=ModelShape(arch, dim=64, layers=2, heads=2, ff=128, max_len=256),
        target_train=tr,
        drafts=(DraftRecipe(ModelShape(arch, dim=32, layers=1, heads=1, ff=64, max_len=256), pretrain=tr,
                            distill=distill),),
        description="CPU smoke test: trains in seconds",
    )


def _distill(seconds: float, batch_size: int, seq_len: int, lr: float, generated_fraction: float = 0.0,
             warmup: int = 30, batch_tokens: int | None = None) -> DistillConfig:
    return DistillConfig(TrainConfig(steps=100_000, max_seconds=seconds, batch_size=batch_size, seq_len=seq_len,
                                     lr=lr, warmup_steps=warmup, min_lr_ratio=0.05, eval_every=250, eval_batches=8,
                                     z_loss=0.0, batch_tokens=batch_tokens), generated_fraction=generated_fraction)


def _eager(d: DistillConfig) -> DistillConfig:
    return replace(d, train=replace(d.train, compile=False))


def _pretrain(seconds: float, batch_size: int = 64, seq_len: int = 512, lr: float = 3e-3) -> TrainConfig:
    return TrainConfig(steps=100_000, max_seconds=seconds, batch_size=batch_size, seq_len=seq_len, lr=lr,
                       warmup_steps=100, eval_every=250, eval_batches=8)


PRESETS: dict[str, PairPreset] = {
    "tiny": _tiny("code"),
    "tiny-ende": _tiny("ende"),
    # v1 of the demo pair (dim 320 × 12 layers) reached only 1.2× on the 2-core CPU: a 5-token verification
    # pass cost 1.7× a 1-token pass there (small-M matmuls), so the target is now deeper and narrower
    # (its time per pass is more per-layer overhead and less weight traffic), see MODEL_CARD.md.
    "demo": PairPreset(
        name="demo",
        corpus="code",
        target=ModelShape("llama", dim=192, layers=24, heads=3, ff=512, max_len=1024),
        target_train=TrainConfig(steps=100_000, max_seconds=200, batch_size=96, seq_len=512, lr=1.5e-3,
                                 warmup_steps=200, eval_every=250, eval_batches=8),
        drafts=(
            DraftRecipe(ModelShape("llama", dim=192, layers=1, heads=3, ff=512, max_len=1024), init="target",
                        distill=_distill(75, 64, 256, 2e-3, generated_fraction=0.5, warmup=50)),
            DraftRecipe(ModelShape("llama", dim=128, layers=1, heads=2, ff=384, max_len=1024),
                        pretrain=_pretrain(35), distill=_distill(45, 64, 256, 1e-3, generated_fraction=0.5)),
        ),
        pool=GeneratedPool(prompt_len=64, new_tokens=192, batch_size=256, max_seconds=20, val_sequences=64),
        export_dtype="float16",
        max_shard_size="15MB",
        description="the CPU demo pair shipped in specdec/assets/demo_pair (Python code)",
    ),
    # The target compiles (torch.compile, inside its 300 s); the 2-layer drafter trains eagerly: its steps
    # take milliseconds, so compiling would cost more of its 30 s budgets than it saves. The drafter is
    # distilled half on the target's own greedy continuations (the text speculative decoding verifies).
    "gpu": PairPreset(
        name="gpu",
        corpus="code",
        target=ModelShape("llama", dim=1024, layers=24, heads=16, ff=2816, max_len=1024),
        target_train=TrainConfig(steps=50_000, max_seconds=300, batch_size=32, seq_len=1024, lr=5e-4,
                                 warmup_steps=200, eval_every=200, eval_batches=8),
        drafts=(DraftRecipe(ModelShape("llama", dim=256, layers=2, heads=4, ff=704, max_len=1024),
                            pretrain=replace(_pretrain(30), compile=False),
                            distill=_eager(_distill(30, 32, 512, 1e-3, generated_fraction=0.5))),),
        pool=GeneratedPool(prompt_len=64, new_tokens=192, batch_size=512, max_seconds=20, val_sequences=64),
        description="one H100/H200: 317M-parameter 24-layer target, 3.7M 2-layer drafter, ~7 minutes",
    ),
    # EnDe on the gettext corpus (223K training pairs from scripts/device_run.sh ende-packages). Batches of ~64K padded
    # positions (source + target, PairData.token_batch: ~2.6K pairs, 9% padding) instead of 512 pairs, and no
    # cuDNN attention in training (zoo.train_steps.training_attention): on an H200 the eager T5 step trained 5.1K
    # pairs/s at 512-pair batches (session 3's run: 2234 steps in 240 s, ~5 epochs, held-out loss still falling
    # at 2.89) and 21K pairs/s with both (`scripts/ende_train_profile.py` at 26f890c: `--variants
    # target-b512,target-t64-nocudnn`), so 240 s are now ~20 epochs; lr 1e-3 → 1.5e-3 for the 5× larger batch.
    # Regularization from small CPU runs (scripts/ende_regularization_cpu.py at 26f890c, a 2.5M-parameter T5, 375 steps,
    # held-out in-domain / out-of-domain loss, lower is better):
    #   3 epochs of 8K pairs:  dropout 0 → 6.31 / 6.18; dropout 0.1 → 6.41 / 6.26; 0.1, no weight decay → 6.43 / 6.30
    #   12 epochs of 2K pairs: dropout 0 → 7.04 / 6.86 (rising from 6.96: overfitting); dropout 0.1 → 6.86 / 6.66
    # so dropout costs ~0.1 nats at 3 epochs and saves ~0.2 at 12: the target, at ~20 epochs, keeps dropout 0.1
    # and weight decay 0.1. No label smoothing: it would flatten p itself, the law T=1 sampling and α measure.
    "gpu-ende": PairPreset(
        name="gpu-ende",
        corpus="ende",
        target=ModelShape("t5", dim=512, layers=6, heads=8, ff=1536, max_len=128, dropout=0.1),
        target_train=TrainConfig(steps=20_000, max_seconds=240, batch_size=512, seq_len=96, lr=1.5e-3,
                                 warmup_steps=200, eval_every=300, eval_batches=8, weight_decay=0.1,
                                 batch_tokens=65536),
        drafts=(DraftRecipe(ModelShape("t5", dim=128, layers=1, heads=2, ff=384, max_len=128),
                            pretrain=replace(_pretrain(30, 256, 96, 2e-3), batch_tokens=65536),
                            distill=_distill(30, 256, 96, 1e-3, batch_tokens=65536)),),
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

    def sc(tc: TrainConfig | None) -> TrainConfig | None:
        if tc is None or tc.max_seconds is None:
            return tc
        return replace(tc, max_seconds=tc.max_seconds * factor)

    drafts = tuple(replace(r, pretrain=sc(r.pretrain),
                           distill=None if r.distill is None else replace(r.distill, train=sc(r.distill.train)))
                   for r in preset.drafts)
    pool = None if preset.pool is None else replace(preset.pool, max_seconds=preset.pool.max_seconds * factor)
    return replace(preset, target_train=sc(preset.target_train), drafts=drafts, pool=pool)
