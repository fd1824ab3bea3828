"""Images as tokens (specdec/zoo/images.py): layout, data, the training recipe, and exact speculative decoding
on the shipped digit pair — greedy identity, and the chi-square kit on the joint law of two pixels at T = 1."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import specdec
from specdec.core import SamplingConfig, standardize_logits
from specdec.zoo.images import (
    IMAGE_PAIR, LAYOUT_FILE, DigitsLayout, get_image_preset, ink_preserving_shifts, load_image_pair,
    train_image_pair,
)
from stats_utils import chi2_pvalue
from test_distribution import FAIL, PASS, LyingDrafter

LAYOUT = DigitsLayout()
shipped = pytest.mark.skipif(not (IMAGE_PAIR / "target" / "config.json").is_file(), reason="image pair not shipped")


def test_layout_round_trip_and_bounds():
    image = np.arange(64).reshape(8, 8) % 17
    seq = LAYOUT.encode(image, 7)
    assert len(seq) == LAYOUT.sequence_length == 67
    assert seq[:2] == LAYOUT.prompt(7) == [1, 3 + 7] and seq[-1] == 2
    assert max(seq) < LAYOUT.vocab_size
    assert np.array_equal(LAYOUT.decode(seq[2:]), image)
    short = LAYOUT.decode([LAYOUT.pixel_offset + 5, 0])  # a non-pixel token, then nothing
    assert short[0, 0] == 5 and short[0, 1] == -1 and (short.ravel()[2:] == -1).all()
    with pytest.raises(ValueError, match="label"):
        LAYOUT.prompt(10)
    with pytest.raises(ValueError, match="pixel"):
        LAYOUT.encode(np.full((8, 8), 17), 0)
    with pytest.raises(ValueError, match="vocab_size"):
        DigitsLayout(vocab_size=20)
    assert DigitsLayout.from_dict(json.loads(json.dumps(LAYOUT.to_dict()))) == LAYOUT


def test_shifts_never_push_ink_off_the_canvas():
    image = np.zeros((8, 8), dtype=int)
    image[2:5, 3] = 9
    moved = ink_preserving_shifts(image)
    assert len(moved) == 9 and all(m.sum() == image.sum() for m in moved)
    image[0, 3] = 4  # ink on the top row: no upward shift
    assert len(ink_preserving_shifts(image)) == 6


def test_tiny_preset_trains_saves_and_loads(tmp_path):
    pytest.importorskip("sklearn")
    summary = train_image_pair(get_image_preset("digits-tiny"), tmp_path, progress=False)
    assert summary["data"]["images"] == 1797 and summary["data"]["val_images"] > 100
    assert summary["target"]["val_loss"] < summary["target"]["val_curve"][0][1]
    assert (tmp_path / "target" / LAYOUT_FILE).is_file() and (tmp_path / "logs" / "distill0.csv").is_file()
    pair = load_image_pair(tmp_path, draft_name="draft0")
    assert pair.layout == LAYOUT and pair.target.config.num_hidden_layers > pair.draft.config.num_hidden_layers


# ---------------------------------------------------------------------------------- the shipped pair


@pytest.fixture(scope="module")
def pair():
    return load_image_pair(IMAGE_PAIR)


@shipped
def test_shipped_pair_is_small_and_documented():
    weights = sorted(IMAGE_PAIR.glob("*/*.safetensors"))
    assert {p.parent.name for p in weights} == {"target", "draft"}
    assert sum(p.stat().st_size for p in weights) <= 5 * 2**20
    assert (IMAGE_PAIR / "MODEL_CARD.md").is_file()


@shipped
@pytest.mark.parametrize("gamma", [1, 4, 8])
def test_greedy_speculative_images_are_the_targets_own(pair, gamma):
    prompts = [LAYOUT.prompt(d) for d in range(10)]  # one batch, ten classes
    plain = specdec.generate(pair.target, prompts, max_new_tokens=64, temperature=0, eos_token_id=[])
    spec = specdec.generate(pair.target, prompts, drafter=pair.draft, max_new_tokens=64, temperature=0,
                            num_draft_tokens=gamma, eos_token_id=[])
    assert spec.sequences == plain.sequences
    assert all((LAYOUT.decode(s) >= 0).all() for s in plain.sequences)  # 64 pixel tokens each
    assert spec.stats.alpha > 0.5


# Chi-square kit: the joint law of the first two pixels of a row. The prompt is the class token of a "3" and
# the first row of a held-out "3" (image 259 of load_digits(), in the validation split); the two sampled
# tokens are pixels (1, 0) and (1, 1). Their exact law has 2.4 nats of entropy under the target at T = 1.
HELD_OUT_THREE_ROW_0 = [0, 0, 10, 16, 10, 1, 0, 0]
CHI2_PROMPT = LAYOUT.prompt(3) + [LAYOUT.pixel_offset + v for v in HELD_OUT_THREE_ROW_0]
ROWS = 4_000


def exact_pixel_pair_law(model) -> np.ndarray:
    """P(t1, t2) = p(t1 | prompt) · p(t2 | prompt, t1) at T = 1, flattened to [V·V]."""
    sampling = SamplingConfig(temperature=1.0)
    with torch.no_grad():
        p1 = standardize_logits(model(torch.tensor([CHI2_PROMPT])).logits[0, -1], sampling)
        seqs = torch.tensor([CHI2_PROMPT + [t] for t in range(LAYOUT.vocab_size)])
        p2 = standardize_logits(model(seqs).logits[:, -1], sampling)
    return (p1[:, None] * p2).flatten().double().numpy()


def sampled_pixel_pairs(pair, drafter) -> np.ndarray:
    res = specdec.generate(pair.target, [CHI2_PROMPT] * ROWS, drafter=drafter, max_new_tokens=2, temperature=1.0,
                           num_draft_tokens=3, seed=11, eos_token_id=[])
    return np.array([s[0] * LAYOUT.vocab_size + s[1] for s in res.sequences]), res.stats


@shipped
def test_two_pixel_law_at_temperature_one_is_the_targets(pair):
    law = exact_pixel_pair_law(pair.target)
    samples, stats = sampled_pixel_pairs(pair, pair.draft)
    assert chi2_pvalue(samples, law) > PASS
    assert 0 < stats.alpha < 1 and stats.accepted_tokens > ROWS // 2


@shipped
def test_negative_control_drafter_reporting_wrong_q_fails_on_images(pair):
    law = exact_pixel_pair_law(pair.target)
    samples, _ = sampled_pixel_pairs(pair, LyingDrafter(pair.draft))
    assert chi2_pvalue(samples, law) < FAIL
