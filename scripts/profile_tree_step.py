"""Count the operators of a tree step's draft and verify halves against a chain step's (CPU, `torch.profiler`).

    OMP_NUM_THREADS=1 python scripts/profile_tree_step.py --temperature 1 --batch 1 --configs "chain;1,1,1,1;4,2,2"

Operators that launch a kernel are counted (views and allocations are not; a `specdec.rng` draw counts once: on CUDA
it is one Triton launch), outermost only, per step, split into the draft half, the verify half and the rest. Inside
a captured CUDA graph each is one replayed kernel of a few µs, so on a small model the count is the step's overhead.
On the CPU the attention is the reference (its mask built per layer), which the CUDA path does in its kernel.
"""

from __future__ import annotations

import argparse
import collections
import functools
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

import specdec.rng as rng
from specdec.bench.demo_pair import DEMO_PAIR, PAIR_PROMPTS, load_pair
from specdec.engine import Engine, EngineConfig
from specdec.engine.step_runner import StepRunner
from specdec.engine.tree_step import TreeStepRunner
from specdec.request import SamplingParams

NOT_KERNELS = {"aten::view", "aten::unsqueeze", "aten::reshape", "aten::slice", "aten::alias", "aten::transpose",
               "aten::permute", "aten::t", "aten::expand", "aten::select", "aten::as_strided", "aten::squeeze",
               "aten::detach", "aten::_unsafe_view", "aten::lift_fresh", "aten::expand_as", "aten::view_as",
               "aten::empty", "aten::empty_strided", "aten::resolve_conj", "aten::resolve_neg", "aten::result_type",
               "aten::_reshape_alias", "aten::unbind", "aten::split", "aten::chunk", "aten::narrow"}


def _tag(owner, name: str, tag: str) -> None:
    fn = getattr(owner, name)

    @functools.wraps(fn)
    def tagged(*args, **kwargs):
        with record_function(tag):
            return fn(*args, **kwargs)

    setattr(owner, name, tagged)


def count(engine: Engine, steps: int) -> dict[str, float]:
    """Operators per step of `steps` engine steps: {"DRAFT": n, "VERIFY": n, "other": n}."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            engine.step()
    phases = collections.Counter()
    for event in prof.events():
        above, parent = [], event.cpu_parent
        while parent is not None:
            above.append(parent.name)
            parent = parent.cpu_parent
        phase = "DRAFT" if "DRAFT" in above else "VERIFY" if "VERIFY" in above else "other"
        if event.name == "RNG" and "RNG" not in above:
            phases[phase] += 1
        elif (event.name.startswith("aten::") and event.name not in NOT_KERNELS and "RNG" not in above
              and not any(a.startswith("aten::") and a not in NOT_KERNELS for a in above)):
            phases[phase] += 1
    return {k: v / steps for k, v in sorted(phases.items())}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--configs", default="chain;1,1,1,1;4,2,2", help="'chain' (γ = 4) or a tree 'k1,k2,...'")
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args(argv)
    for name in ("uniforms", "exponentials", "sample"):
        _tag(rng, name, "RNG")
    for runner in (StepRunner, TreeStepRunner):
        _tag(runner, "draft_body", "DRAFT")
        _tag(runner, "verify_body", "VERIFY")
    torch.set_num_threads(1)
    target, draft, tokenizer = load_pair(Path(DEMO_PAIR), device="cpu", dtype="float32")
    prompts = [tokenizer(p)["input_ids"] for p in PAIR_PROMPTS]
    for config in args.configs.split(";"):
        tree = None if config == "chain" else tuple(int(k) for k in config.split(","))
        engine = Engine(target, draft, EngineConfig(max_batch_size=args.batch, max_seq_len=256, num_draft_tokens=4,
                                                    max_draft_tokens=8, max_tree_nodes=64))
        engine.policy.set_fixed(4)
        for i in range(args.batch):
            engine.add_request(prompts[i % len(prompts)], SamplingParams(
                temperature=args.temperature, max_new_tokens=60, seed=i, eos_token_ids=(), draft_tree=tree))
        for _ in range(3):  # past admission
            engine.step()
        print(config, count(engine, args.steps), flush=True)


if __name__ == "__main__":
    main()
