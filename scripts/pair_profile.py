"""Where a request's time goes on the Qwen pair (engine, batch 1, T = 0, 16 tokens, `cpu_linear` "onednn"): the
FastLlama passes of the target and the draft by rows ("prefill" = more than 9), and the rest (engine host work,
sampling, setup), in CPU seconds of one thread. Plain, then γ = 5, twice per prompt; the second round is the warm one.

    SPECDEC_QWEN_PAIR=/work/models/qwen OMP_NUM_THREADS=1 python scripts/pair_profile.py
"""

from __future__ import annotations

import collections
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import specdec  # noqa: E402
from specdec.bench.demo_pair import QWEN_CPU_LINEAR, QWEN_DRAFT, QWEN_TARGET, load_pair, qwen_pair_folder  # noqa: E402
from specdec.fast.kernels import cpu_linear  # noqa: E402
from specdec.fast.model import FastLlama  # noqa: E402


def main() -> None:
    from paper_tables_pair import prompt_sets

    torch.set_num_threads(1)
    cpu_linear.MODE = QWEN_CPU_LINEAR
    target, draft, tok = load_pair(qwen_pair_folder(), names=(QWEN_TARGET, QWEN_DRAFT))
    rec = collections.defaultdict(lambda: [0, 0.0])
    orig = FastLlama.forward

    def forward(self, tokens, *a, **k):  # (each pass's CPU seconds, by model and rows)
        start = time.process_time()
        out = orig(self, tokens, *a, **k)
        who = "target" if self.shape.n_layers == target.config.num_hidden_layers else "draft"
        rows = int(tokens.shape[1]) if tokens is not None else -1
        key = (who, rows if rows <= 9 else "prefill")
        rec[key][0] += 1
        rec[key][1] += time.process_time() - start
        return out

    FastLlama.forward = forward
    prompts = prompt_sets(tok, 2)
    n = 16
    for name, t, gamma in (("chat", 0.0, 5), ("code", 0.0, 5)):
        ids = prompts[name][0]
        for drafter, g in ((None, 0), (draft, gamma), (None, 0), (draft, gamma)):  # second round is the one kept
            rec.clear()
            start = time.process_time()
            res = specdec.generate(target, [ids], drafter=drafter, max_new_tokens=n, temperature=t,
                                   num_draft_tokens=g, eos_token_id=[], seed=0, engine="fast")
            total = time.process_time() - start
            passes = {f"{w}:{r}": [c, round(x, 3)] for (w, r), (c, x) in sorted(rec.items(), key=str)}
            print(json.dumps({"prompts": name, "prompt_tokens": len(ids), "gamma": g, "cpu_s": round(total, 3),
                              "in_passes_s": round(sum(x for _, x in rec.values()), 3), "passes": passes,
                              "row_steps": res.stats.row_steps,
                              "beta": round(res.stats.beta_sum / max(res.stats.beta_count, 1), 3)}), flush=True)


if __name__ == "__main__":
    main()
