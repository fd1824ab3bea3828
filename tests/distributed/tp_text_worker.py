"""Run by test_tensor_parallel.py under `torchrun --nproc-per-node 2`: the text API with tensor_parallel_size=2.

argv: OUT.json TARGET_DIR DRAFT_DIR [mixed | policy]. Rank 0 generates (a batch, a stream, requests asking another γ and "auto") and
closes the LLM; rank 1 follows inside `specdec.load` and exits there. Rank 0 writes the texts. With "mixed": the
mixed prefill/decode step's run (`mixed`); with "policy": a policy object choosing apart on each rank (`policy`).
"""

from __future__ import annotations

import json
import sys

import torch

torch.set_num_threads(1)

import specdec  # noqa: E402

PROMPTS = ["w1 w2 w3 w4", "w5 w6", "w7 w7 w8 w9 w7"]


MIXED_PROMPTS = [" ".join(f"w{i}" for i in range(1, 25)), "w5 w6 w7", " ".join(f"w{i % 7 + 30}" for i in range(30)),
                 " ".join(f"w{i}" for i in range(40, 59))]


def mixed(out: str, target: str, draft: str) -> None:
    """The mixed step through the leader/follower channel: 2 slots for 4 prompts, so the later ones are admitted
    while others run and fed inside their verify steps, under the "auto" budget (each rank times its own steps;
    the ranks feed rank 0's: `ShardedFastLlama.leader_int`)."""
    llm = specdec.load(target, draft, device="cpu", num_draft_tokens=3, tensor_parallel_size=2, max_batch_size=2,
                       mixed_step=True)
    greedy = [c.text for c in llm.generate(MIXED_PROMPTS, max_new_tokens=12, temperature=0)]
    sampled = [c.text for c in llm.generate(MIXED_PROMPTS, max_new_tokens=12, temperature=1.0, seed=5)]
    mixed_steps = llm.runner().runner.num_mixed_steps
    llm.close()
    with open(out, "w", encoding="utf-8") as fh:
        json.dump({"greedy": greedy, "sampled": sampled, "mixed_steps": mixed_steps}, fh)


class RankPolicy(specdec.DraftLengthPolicy):
    """Chooses apart on each rank: rank 0 asks 1, 2, 3, 1, ...; rank 1 always 4. Records what each step ran."""

    def __init__(self, rank: int):
        self.rank, self.asks, self.ran = rank, 0, []

    def num_draft_tokens(self) -> int:
        self.asks += 1
        return 4 if self.rank else 1 + (self.asks - 1) % 3

    def update(self, outcome) -> None:
        self.ran.append(int(outcome.draft_lengths.max()) if outcome.draft_lengths.numel() else 0)

    def reset(self) -> None:
        self.asks, self.ran = 0, []


def policy(out: str, target: str, draft: str) -> None:
    """A draft-length policy object as the default γ under TP: each rank's own (choosing apart); every rank runs
    rank 0's choice. Each rank writes the draft lengths its steps ran (rank 1 as it leaves `load`)."""
    import torch.distributed as dist

    rank = int(__import__("os").environ["RANK"])
    chooser = RankPolicy(rank)
    try:
        llm = specdec.load(target, draft, device="cpu", num_draft_tokens=chooser, tensor_parallel_size=2)
    except SystemExit:  # rank 1, once rank 0 closed the LLM
        with open(f"{out}.rank1", "w", encoding="utf-8") as fh:
            json.dump({"ran": chooser.ran, "asks": chooser.asks}, fh)
        raise
    assert dist.get_rank() == 0
    greedy = [c.text for c in llm.generate(PROMPTS, max_new_tokens=12, temperature=0)]
    asked = list(llm.runner().engine.policy.loop.asked)
    llm.close()
    with open(out, "w", encoding="utf-8") as fh:
        json.dump({"greedy": greedy, "ran": chooser.ran, "asked": asked}, fh)


def main() -> None:
    out, target, draft, *mode = sys.argv[1:]
    if mode == ["mixed"]:
        return mixed(out, target, draft)
    if mode == ["policy"]:
        return policy(out, target, draft)
    llm = specdec.load(target, draft, device="cpu", num_draft_tokens=3, tensor_parallel_size=2)  # rank 1 stays here
    greedy = [c.text for c in llm.generate(PROMPTS, max_new_tokens=12, temperature=0)]
    sampled = [c.text for c in llm.generate(PROMPTS, max_new_tokens=12, temperature=1.0, seed=5)]
    streamed = "".join(llm.stream(PROMPTS[0], max_new_tokens=12, temperature=0))
    other_gamma = llm.generate(PROMPTS[1], max_new_tokens=12, temperature=0, num_draft_tokens=2).text
    auto_gamma = [c.text for c in llm.generate(PROMPTS, max_new_tokens=12, temperature=0, num_draft_tokens="auto")]
    unseeded = llm.generate(PROMPTS[2], max_new_tokens=12, temperature=1.0)  # the leader picks the seed
    llm.close()
    with open(out, "w", encoding="utf-8") as fh:
        json.dump({"greedy": greedy, "sampled": sampled, "streamed": streamed, "other_gamma": other_gamma, "auto_gamma": auto_gamma,
                   "unseeded": {"tokens": len(unseeded.token_ids), "finish_reason": unseeded.finish_reason}}, fh)


if __name__ == "__main__":
    main()
