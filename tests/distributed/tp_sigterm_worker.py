"""Run by test_tensor_parallel_sigterm.py under `torchrun --nproc-per-node 2`: ranks under load until a signal.

argv: DIR TARGET_DIR DRAFT_DIR MODE. Every rank writes DIR/rank{r}.pid, then loads through `specdec.load(...,
tensor_parallel_size=2)` (the engine on its default paged pool; rank 1 follows rank 0's steps inside it). Rank 0
generates batches of requests (greedy and sampled, draft caps 0 and 3) in a loop that never ends; once one batch
has run on both ranks it writes DIR/ready (its engine's KV layout), so a signal sent after that finds requests
running. MODE "follow" is the library as it is; "stubborn" is the negative control: rank 1 ignores SIGTERM and,
when following fails (its peer gone), keeps the process alive instead of exiting — a hung rank.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import torch

torch.set_num_threads(1)

import specdec  # noqa: E402
from specdec.request import SamplingParams  # noqa: E402

PROMPTS = ["w1 w2 w3 w4", "w5 w6", "w7 w7 w8 w9 w7", "w2 w4"]
MAX_NEW = 24


def _write(path: str, text: str) -> None:
    """Whole or not at all: the test polls for the file."""
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(path + ".tmp", path)


def main() -> None:
    folder, target, draft, mode = sys.argv[1:]
    rank = int(os.environ["RANK"])
    _write(os.path.join(folder, f"rank{rank}.pid"), str(os.getpid()))
    if mode == "stubborn" and rank == 1:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            specdec.load(target, draft, device="cpu", num_draft_tokens=3, tensor_parallel_size=2)
        except BaseException:  # noqa: BLE001 - the negative control: a follower that never leaves
            pass
        while True:
            time.sleep(1.0)
    llm = specdec.load(target, draft, device="cpu", num_draft_tokens=3, tensor_parallel_size=2)  # rank 1 stays here
    params = [SamplingParams(max_new_tokens=MAX_NEW, temperature=t, seed=i, num_draft_tokens=g)
              for i, (t, g) in enumerate([(0.0, 3), (1.0, 3), (0.0, 0), (1.0, 0)])]
    batches = 0
    while True:
        llm.generate(PROMPTS, params)
        batches += 1
        if batches == 1:
            engine = llm.runner().engine
            _write(os.path.join(folder, "ready"), json.dumps({"kv_layout": engine.config.kv_layout}))


if __name__ == "__main__":
    main()
