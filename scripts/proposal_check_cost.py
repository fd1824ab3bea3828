"""What `core.proposals.proposal_check` costs per step, on this machine's CPU (or a GPU with --device cuda):
the check alone, next to one `core.verify` of the same step, for a few (B, γ, V).

    python scripts/proposal_check_cost.py [--device cpu] [--repeats 50]

A benchmark, not a test: it prints a table and asserts nothing.
"""

from __future__ import annotations

import argparse
import time

import torch

from specdec.core import verify
from specdec.core.proposals import proposal_check


def _time(fn, repeats: int, device: torch.device) -> float:
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(f"device {device}, {torch.get_num_threads()} threads, {args.repeats} repeats")
    print(f"{'B':>4} {'γ':>3} {'V':>7} | {'check µs':>9} {'verify µs':>10} {'check/verify':>12}")
    for batch, gamma, vocab in [(1, 4, 32_000), (8, 4, 32_000), (8, 4, 151_936), (32, 4, 49_152)]:
        gen = torch.Generator(device=device).manual_seed(0)
        q = torch.softmax(torch.randn(batch, gamma, vocab, generator=gen, device=device), -1)
        p = torch.softmax(torch.randn(batch, gamma + 1, vocab, generator=gen, device=device), -1)
        tokens = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).reshape(batch, gamma)
        lengths = torch.full((batch,), gamma, device=device)
        active = torch.ones(batch, dtype=torch.bool, device=device)
        check = _time(lambda: proposal_check(tokens, q, lengths, vocab, active), args.repeats, device)
        ver = _time(lambda: verify(tokens, q, p, gen), args.repeats, device)
        print(f"{batch:>4} {gamma:>3} {vocab:>7} | {check * 1e6:>9.0f} {ver * 1e6:>10.0f} {check / ver:>12.2f}")


if __name__ == "__main__":
    main()
