"""What logits processors cost: tok/s of the demo pair with and without penalties + logit_bias + min_tokens.

    python scripts/processors_cost.py [--device cpu] [--rounds 3] [--out processors_cost.json]

Runners: the engine (`Engine`, per-slot history on the device, a processed step flavor; CUDA graphs on a GPU) and
the transformers loop (`engine="hf"`, `BatchProcessors`). Batch 1 and 8, greedy, γ = 4 (the model drafter) and
plain decoding. Rounds alternate plain and processed runs of the same requests so machine load hits both alike;
the median round is reported. Greedy with processors changes the text, so the token counts differ a little: the
figure is generated tokens per second.
"""

import argparse
import json
import statistics
import time

import torch

import specdec
from specdec.cli.demo import DEMO_PAIR, PROMPTS
from specdec.engine import Engine, EngineConfig
from specdec.loading import load_model, load_tokenizer
from specdec.metrics import SpecStats
from specdec.request import SamplingParams

PROCESSED = dict(repetition_penalty=1.2, frequency_penalty=0.5, presence_penalty=0.3,
                 logit_bias={5: 2.0, 17: -3.0, 100: 1.0}, min_tokens=16)


def engine_run(engine, prompts, params) -> tuple[int, float, float | None]:
    engine.stats = SpecStats()
    start = time.perf_counter()
    for p in prompts:
        engine.add_request(p, params)
    tokens = 0
    while engine.has_unfinished():
        tokens += sum(len(o.new_token_ids) for o in engine.step())
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return tokens, seconds, engine.stats.alpha


def loop_run(target, draft, prompts, gamma, kwargs) -> tuple[int, float, float | None]:
    start = time.perf_counter()
    res = specdec.generate(target, prompts, draft if gamma else None, num_draft_tokens=gamma, engine="hf", **kwargs)
    return sum(len(s) for s in res.sequences), time.perf_counter() - start, res.stats.alpha


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", default="processors_cost.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    target = load_model(DEMO_PAIR / "target", device=args.device, what="target")
    draft = load_model(DEMO_PAIR / "draft", device=args.device, what="draft")
    tokenizer = load_tokenizer(DEMO_PAIR / "target")
    ids = [tokenizer(p)["input_ids"] for p in PROMPTS]
    eos = tuple(target.generation_config.eos_token_id if isinstance(target.generation_config.eos_token_id, list)
                else [target.generation_config.eos_token_id])
    base = dict(max_new_tokens=args.max_new_tokens, temperature=0, eos_token_ids=eos)
    rows = []
    with torch.inference_mode():
        for batch in (1, 8):
            prompts = (ids * batch)[:batch]
            for gamma in (0, 4):
                engine = Engine(target, draft if gamma else None, EngineConfig(
                    max_batch_size=8, max_seq_len=256, num_draft_tokens=max(gamma, 1)))
                engine_run(engine, prompts, SamplingParams(**base))  # warm up both flavors (graphs on CUDA)
                engine_run(engine, prompts, SamplingParams(**base, **PROCESSED))
                for runner in ("engine", "hf"):
                    rates = {"plain": [], "processed": []}
                    alphas = {}
                    for _ in range(args.rounds):
                        for name, extra in (("plain", {}), ("processed", PROCESSED)):
                            if runner == "engine":
                                n, s, alphas[name] = engine_run(engine, prompts, SamplingParams(**base, **extra))
                            else:
                                kwargs = dict(max_new_tokens=args.max_new_tokens, temperature=0, eos_token_id=list(eos),
                                              **extra)
                                n, s, alphas[name] = loop_run(target, draft, prompts, gamma, kwargs)
                            rates[name].append(n / s)
                    row = {"runner": runner, "batch": batch, "gamma": gamma,
                           "plain_tok_s": statistics.median(rates["plain"]),
                           "processed_tok_s": statistics.median(rates["processed"])}
                    row["ratio"] = row["processed_tok_s"] / row["plain_tok_s"]
                    if gamma:  # the processed text is another text: its acceptance differs
                        row["plain_alpha"], row["processed_alpha"] = alphas["plain"], alphas["processed"]
                    rows.append(row)
                    print(json.dumps(row))
    with open(args.out, "w") as f:
        json.dump({"device": args.device, "processors": {k: str(v) for k, v in PROCESSED.items()}, "rows": rows}, f,
                  indent=1)


if __name__ == "__main__":
    main()
