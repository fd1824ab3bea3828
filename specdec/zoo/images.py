"""Autoregressive images over pixel tokens: scikit-learn's bundled 8×8 digits, a class-conditioned pair.

Nothing in speculative decoding is specific to text (the paper's §6): any autoregressive model over
discrete tokens can be drafted and verified exactly. Here one token is one pixel's intensity; the data
set's 17 grey levels (0..16) are the pixel vocabulary as they are, no quantization needed.

Token layout (`DigitsLayout`, vocabulary 32):

    0 <pad>   1 <s>   2 </s>     the zoo's special ids (specdec.zoo.models PAD_ID / BOS_ID / EOS_ID)
    3 .. 12   class tokens "digit 0" .. "digit 9"
    13 .. 29  pixel intensities 0 .. 16
    30, 31    unused (the vocabulary is rounded up to 32)

An image is `<s> <digit d> p(0,0) p(0,1) … p(7,7) </s>`, 67 tokens, pixels row by row (raster order).
Sampling an image = the prompt `[<s>, <digit d>]`, then exactly 64 new tokens. No row tokens: every row
has 8 pixels, so a row token would be a free (always accepted) guess that only inflates α.

Data (`load_digits_data`): `sklearn.datasets.load_digits()` ships inside scikit-learn (no download),
1,797 images. An image is in the validation split when the hash of its bytes falls below `val_fraction`
(as the text corpora split by file). Training images are augmented with the one-pixel shifts that move
no ink off the canvas (up to 9 versions per image). Training reuses the zoo: `build_model`,
`run_training`, `distill_draft` and `save_model`, with `ImageData` in place of a token stream.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from specdec.zoo.corpus import split_of
from specdec.zoo.distill import distill_draft
from specdec.zoo.presets import DistillConfig, DraftRecipe, ModelShape, PairPreset, TrainConfig
from specdec.zoo.models import BOS_ID, EOS_ID, build_model, count_params, resolve_device, save_model
from specdec.zoo.train import run_training

logger = logging.getLogger(__name__)

LAYOUT_FILE = "image_layout.json"  # next to config.json in every image model folder
IMAGE_PAIR = Path(__file__).resolve().parent.parent / "assets" / "image_pair"


@dataclass(frozen=True)
class DigitsLayout:
    """Where classes and pixels live in the vocabulary (see the module docstring)."""

    height: int = 8
    width: int = 8
    levels: int = 17  # grey levels 0 .. levels-1
    num_classes: int = 10
    class_offset: int = 3
    pixel_offset: int = 13
    vocab_size: int = 32

    def __post_init__(self) -> None:
        if self.class_offset <= max(BOS_ID, EOS_ID) or self.pixel_offset < self.class_offset + self.num_classes:
            raise ValueError("layout: class and pixel tokens must follow the special tokens without overlap")
        if self.pixel_offset + self.levels > self.vocab_size:
            raise ValueError(f"layout: vocab_size {self.vocab_size} is too small for {self.levels} levels")

    @property
    def num_pixels(self) -> int:
        return self.height * self.width

    @property
    def sequence_length(self) -> int:
        """<s>, class, pixels, </s>."""
        return self.num_pixels + 3

    def prompt(self, label: int) -> list[int]:
        """`[<s>, <digit label>]`: what a sampler starts from."""
        if not 0 <= int(label) < self.num_classes:
            raise ValueError(f"label must be in [0, {self.num_classes}), got {label!r}")
        return [BOS_ID, self.class_offset + int(label)]

    def encode(self, image: np.ndarray, label: int) -> list[int]:
        """`image [H, W]` of ints in [0, levels) → the 67-token training sequence."""
        image = np.asarray(image)
        if image.shape != (self.height, self.width):
            raise ValueError(f"image must be {self.height}×{self.width}, got shape {image.shape}")
        if image.min() < 0 or image.max() >= self.levels:
            raise ValueError(f"pixel values must be in [0, {self.levels}), got {image.min()}..{image.max()}")
        pixels = (image.astype(np.int64).ravel() + self.pixel_offset).tolist()
        return self.prompt(label) + pixels + [EOS_ID]

    def decode(self, tokens: Sequence[int]) -> np.ndarray:
        """The first `H·W` generated tokens → `[H, W]` int grey levels; a token that is not a pixel
        (or a missing one, if the sequence is short) becomes -1."""
        out = np.full(self.num_pixels, -1, dtype=np.int64)
        ids = np.asarray(list(tokens)[: self.num_pixels], dtype=np.int64) - self.pixel_offset
        ok = (ids >= 0) & (ids < self.levels)
        out[: len(ids)][ok] = ids[ok]
        return out.reshape(self.height, self.width)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> DigitsLayout:
        return cls(**{k: int(d[k]) for k in cls.__dataclass_fields__ if k in d})


# -------------------------------------------------------------------------------------------- data


@dataclass
class ImageData:
    """Token sequences of images, in the shape `run_training` and `distill_draft` expect of a corpus."""

    train: torch.Tensor  # [N, 67] long
    val: torch.Tensor  # [M, 67] long
    meta: dict
    tokenizer_dir: None = None  # pixels need no tokenizer

    def train_batch(self, batch_size: int, seq_len: int, rng: np.random.Generator) -> torch.Tensor:
        """`[B, 67]` random training images (inputs are [:, :-1], targets [:, 1:]); seq_len is fixed by the layout."""
        del seq_len
        return self.train[torch.from_numpy(rng.integers(0, len(self.train), size=batch_size))]

    def val_batches(self, batch_size: int, seq_len: int, max_batches: int) -> list[torch.Tensor]:
        """The first `batch_size · max_batches` validation images, same every call."""
        del seq_len
        rows = self.val[: batch_size * max_batches]
        return [rows[i : i + batch_size] for i in range(0, len(rows), batch_size)]


def _load_sklearn_digits() -> tuple[np.ndarray, np.ndarray]:
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("the digits data set ships with scikit-learn: pip install 'specdec[image]'") from err
    digits = load_digits()
    return digits.images.astype(np.int64), digits.target.astype(np.int64)


def ink_preserving_shifts(image: np.ndarray) -> list[np.ndarray]:
    """The image moved by (dy, dx) ∈ {-1, 0, 1}², for each move that pushes no ink off the canvas."""
    out = []
    for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
            rows = {-1: image[0], 1: image[-1]}.get(dy)
            cols = {-1: image[:, 0], 1: image[:, -1]}.get(dx)
            if (rows is not None and rows.any()) or (cols is not None and cols.any()):
                continue
            out.append(np.roll(np.roll(image, dy, axis=0), dx, axis=1))
    return out


def load_digits_data(layout: DigitsLayout = DigitsLayout(), *, val_fraction: float = 0.1,
                     augment: bool = True) -> ImageData:
    """scikit-learn's 8×8 digits as token sequences: train (augmented by shifts) and validation splits."""
    images, labels = _load_sklearn_digits()
    if images.shape[1:] != (layout.height, layout.width) or images.max() >= layout.levels:
        raise ValueError(f"layout {layout} does not fit the digits data ({images.shape[1:]}, max {images.max()})")
    train, val, n_train_images = [], [], 0
    for image, label in zip(images, labels):
        if split_of(image.astype(np.uint8).tobytes(), val_fraction) == "val":
            val.append(layout.encode(image, label))
            continue
        n_train_images += 1
        for moved in ink_preserving_shifts(image) if augment else [image]:
            train.append(layout.encode(moved, label))
    meta = {"corpus": "digits", "source": "sklearn.datasets.load_digits", "images": len(images),
            "train_images": n_train_images, "train_sequences": len(train), "val_images": len(val),
            "val_fraction": val_fraction, "augment": augment, "vocab_size": layout.vocab_size,
            "layout": layout.to_dict()}
    return ImageData(torch.tensor(train), torch.tensor(val), meta)


# ----------------------------------------------------------------------------------------- presets


def _digits_preset() -> PairPreset:
    seq = DigitsLayout().sequence_length - 1
    # Fixed step counts (no time budget), so the same command gives the same weights on any CPU. The target
    # stops near its held-out minimum: 1,614 training images are few, and a first run of 1,500 steps
    # memorized them (held-out loss 1.19 at step 500, 1.31 at step 1,000).
    target_train = TrainConfig(steps=600, batch_size=64, seq_len=seq, lr=3e-3, warmup_steps=60,
                               eval_every=100, eval_batches=4)
    pretrain = TrainConfig(steps=1500, batch_size=64, seq_len=seq, lr=3e-3, warmup_steps=100, eval_every=250,
                           eval_batches=4)  # one layer of width 64 does not memorize in 1,500 steps
    distill = DistillConfig(TrainConfig(steps=600, batch_size=64, seq_len=seq, lr=1e-3, warmup_steps=30,
                                        min_lr_ratio=0.05, eval_every=200, eval_batches=4, z_loss=0.0),
                            alpha_batches=4)
    # Deep and narrow target, one-layer drafter: on a CPU a forward pass costs mostly per-layer overhead,
    # so depth sets the cost ratio c (16 layers: c ≈ 0.17 for one drafter layer, see MODEL_CARD.md).
    return PairPreset(
        name="digits",
        corpus="digits",
        target=ModelShape("llama", dim=64, layers=16, heads=2, ff=192, max_len=128),
        target_train=target_train,
        drafts=(DraftRecipe(ModelShape("llama", dim=64, layers=1, heads=2, ff=192, max_len=128), pretrain=pretrain,
                            distill=distill),),
        export_dtype="float16",
        description="8×8 digits (scikit-learn), class-conditioned pixel tokens; CPU, ~15 minutes",
    )


def _digits_tiny_preset() -> PairPreset:
    seq = DigitsLayout().sequence_length - 1
    tr = TrainConfig(steps=20, batch_size=16, seq_len=seq, lr=3e-3, warmup_steps=5, eval_every=10, eval_batches=1)
    return PairPreset(
        name="digits-tiny",
        corpus="digits",
        target=ModelShape("llama", dim=32, layers=2, heads=1, ff=64, max_len=128),
        target_train=tr,
        drafts=(DraftRecipe(ModelShape("llama", dim=16, layers=1, heads=1, ff=32, max_len=128), pretrain=tr,
                            distill=DistillConfig(tr, alpha_batches=1)),),
        description="CPU smoke test of the image pipeline: seconds",
    )


IMAGE_PRESETS: dict[str, PairPreset] = {"digits": _digits_preset(), "digits-tiny": _digits_tiny_preset()}


def get_image_preset(name: str) -> PairPreset:
    try:
        return IMAGE_PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown image preset {name!r}; choose one of {', '.join(IMAGE_PRESETS)}") from None


# ---------------------------------------------------------------------------------------- training


@dataclass
class ImagePair:
    target: torch.nn.Module
    draft: torch.nn.Module
    layout: DigitsLayout


def train_image_pair(
    preset: PairPreset,
    out_dir: str | os.PathLike,
    *,
    layout: DigitsLayout = DigitsLayout(),
    device: str | torch.device | None = "cpu",
    progress: bool = True,
    augment: bool = True,
) -> dict:
    """Train `preset`'s target and drafters on the digits; write `out_dir/{target,draft0,..,logs}` and
    `summary.json` (validation losses, α before/after distillation on held-out images); return the summary."""
    if preset.corpus != "digits":
        raise ValueError(f"preset {preset.name!r} is for the {preset.corpus!r} corpus, not 'digits'")
    device = resolve_device(device)
    data = load_digits_data(layout, augment=augment)
    out = Path(out_dir)
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    summary: dict = {"preset": preset.name, "device": str(device), "torch": torch.__version__, "data": data.meta,
                     "preset_config": asdict(preset)}

    def save(model, name):
        folder = save_model(model, out / name, None, dtype=preset.export_dtype)
        (folder / LAYOUT_FILE).write_text(json.dumps(layout.to_dict(), indent=1) + "\n")

    target = build_model(preset.target, layout.vocab_size, seed=preset.target_train.seed)
    result = run_training(target, data, preset.target_train, log_path=logs / "target.csv", device=device,
                          progress=progress, desc=f"{preset.name} target")
    save(target, "target")
    summary["target"] = {"shape": asdict(preset.target), "params": count_params(target), **result.to_dict()}
    summary["drafts"] = []
    for i, recipe in enumerate(preset.drafts):
        draft = build_model(recipe.shape, layout.vocab_size, seed=i + 1)
        entry: dict = {"shape": asdict(recipe.shape), "params": count_params(draft),
                       "params_ratio": round(count_params(target) / count_params(draft), 1)}
        if recipe.pretrain is not None:
            entry.update(run_training(draft, data, recipe.pretrain, log_path=logs / f"draft{i}.csv", device=device,
                                      progress=progress, desc=f"{preset.name} draft{i}").to_dict())
        if recipe.distill is not None:
            entry["distill"] = distill_draft(target, draft, data, recipe.distill, log_path=logs / f"distill{i}.csv",
                                             device=device, progress=progress,
                                             desc=f"{preset.name} distill{i}").to_dict()
        save(draft, f"draft{i}")
        summary["drafts"].append(entry)
    summary["total_seconds"] = round(time.perf_counter() - t_start, 1)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary


def load_image_pair(folder: str | os.PathLike = IMAGE_PAIR, draft_name: str = "draft") -> ImagePair:
    """(target, draft, layout) from a folder holding `target/` and `draft/` (fp32, eval mode, CPU)."""
    from transformers import AutoModelForCausalLM

    folder = Path(folder)
    for name in ("target", draft_name):
        if not (folder / name / "config.json").is_file():
            raise FileNotFoundError(f"{folder / name} is not a model folder (no config.json)")
    layout_path = folder / "target" / LAYOUT_FILE
    if not layout_path.is_file():
        raise FileNotFoundError(f"{layout_path} is missing: not an image model folder")
    layout = DigitsLayout.from_dict(json.loads(layout_path.read_text()))
    target = AutoModelForCausalLM.from_pretrained(str(folder / "target"), dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(str(folder / draft_name), dtype=torch.float32).eval()
    if target.config.vocab_size != layout.vocab_size or draft.config.vocab_size != layout.vocab_size:
        raise ValueError(f"{folder}: model vocabularies ({target.config.vocab_size}, {draft.config.vocab_size}) "
                         f"differ from the layout's {layout.vocab_size}")
    return ImagePair(target, draft, layout)
