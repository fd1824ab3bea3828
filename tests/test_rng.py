"""The counter-based reference (`specdec.rng`): device-independent exponentials, the race's contract, arguments."""

import numpy as np
import pytest
import torch

from specdec import rng
from specdec.core import sample as core_sample


def test_every_float64_log_rounds_to_the_same_float32_exponential():
    """All 2^23 unit values: -ln u (float64) sits far from every float32 rounding midpoint, so any float64 log
    accurate to a few ulps (torch CPU / CUDA, numpy, libdevice) gives `_neg_log`'s bits."""
    k = np.arange(1 << 23, dtype=np.int64)
    u = (k.astype(np.float32) + np.float32(0.5)) * np.float32(1.0 / (1 << 23))
    assert np.array_equal(u.astype(np.float64), (k + 0.5) / (1 << 23))  # the unit values are exact
    x = -np.log(u.astype(np.float64))
    f = x.astype(np.float32)
    side = np.where(x >= f.astype(np.float64), np.float32(np.inf), np.float32(-np.inf))
    midpoint = (f.astype(np.float64) + np.nextafter(f, side).astype(np.float64)) / 2  # exact in float64
    assert (np.abs(x - midpoint) / np.spacing(x)).min() >= 64
    ours = rng._neg_log(torch.from_numpy(u))
    assert torch.equal(ours, torch.from_numpy(f))  # torch's float64 log rounds like numpy's
    assert not torch.equal(ours, -torch.log(torch.from_numpy(u)))  # (float32 logs would not be portable)


def test_sample_is_the_race_against_the_counter_noise():
    g = torch.Generator().manual_seed(0)
    probs = torch.rand(6, 50, generator=g) ** 4
    seed, position = torch.arange(6) * 1000003, torch.arange(6) + 2**31
    noise = rng.exponentials(seed, position[:, None], rng.DRAFT, 50)[:, 0]
    assert torch.equal(rng.sample(probs, seed, position, rng.DRAFT), core_sample(probs, noise=noise))
    assert not torch.equal(noise, rng.exponentials(seed, position[:, None], rng.NEXT, 50)[:, 0])


def test_exponentials_have_mean_one_and_streams_differ():
    seed = torch.arange(64, dtype=torch.long) * 7919 + 2**40
    e = rng.exponentials(seed, torch.arange(3)[None, :].expand(64, -1), rng.DRAFT, 257)
    assert e.shape == (64, 3, 257) and e.dtype == torch.float32 and (e > 0).all()
    assert abs(e.mean().item() - 1) < 0.02 and abs(e.var().item() - 1) < 0.05


def test_kernel_argument_is_checked():
    seed, position = torch.zeros(2, dtype=torch.long), torch.zeros(2, 1, dtype=torch.long)
    with pytest.raises(ValueError, match="kernel"):
        rng.uniforms(seed, position, rng.ACCEPT, kernel="fast")
    assert torch.equal(rng.uniforms(seed, position, rng.ACCEPT, kernel="reference"),
                       rng.uniforms(seed, position, rng.ACCEPT))  # "auto" on CPU is the reference
