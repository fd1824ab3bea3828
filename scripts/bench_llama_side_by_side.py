"""llama.cpp beside specdec on the chat demo's GGUF (SmolLM2-135M-Instruct Q4_1): plain tokens/s, same prompts, same
threads, the arms interleaved and repeated (the machine may be shared: quote medians and ranges).

    python scripts/bench_llama_side_by_side.py --llama-cli /work/llamacpp/build/bin/llama-cli \
        [--threads 2] [--repeats 3] [--tokens 128] [--prompts 6] [--arms llama,quantized,dequantized]

Arms, each run as its own process per repeat, in order, `--repeats` times:
  llama        `llama-cli -m GGUF -p <the chat-formatted prompt> -n TOKENS -t THREADS --temp 0 -no-cnv` per prompt;
               tokens/s = its "eval time" line (generation only, as specdec's figure), summed over the prompts
  quantized    `specdec demo --json --threads THREADS --gguf-weights quantized` (plain and speculative tok/s)
  dequantized  the same with `--gguf-weights dequantized` (float32 weights, oneDNN)
One JSON line per run, then a summary line (median, min, max per arm and figure). llama.cpp is not a dependency of
specdec: build it apart (docs/benchmarks/quantized_cpu.md has the commands). Benchmarks are not tests.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

EVAL = re.compile(r"eval time =\s*([\d.]+) ms /\s*(\d+) (?:runs|tokens)")


def _prompts(n: int) -> tuple[str, list[str]]:
    from specdec.cli.demo_chat import find_gguf, load_gguf
    from specdec.zoo.instructions import DEMO_PROMPTS

    gguf = find_gguf()
    _, tokenizer = load_gguf(gguf)
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                           tokenize=False) for p in list(DEMO_PROMPTS)[:n]]
    return str(gguf), texts


def _llama(args, gguf: str, texts: list[str]) -> dict:
    ms = tokens = 0.0
    for text in texts:
        run = subprocess.run([args.llama_cli, "-m", gguf, "-p", text, "-n", str(args.tokens), "-t", str(args.threads),
                              "--temp", "0", "-no-cnv", "--no-warmup"], capture_output=True, text=True,
                             timeout=args.timeout, stdin=subprocess.DEVNULL)
        found = [m for m in EVAL.finditer(run.stderr) if "prompt eval" not in
                 run.stderr[max(0, m.start() - 8):m.start()]]
        if run.returncode or not found:
            raise RuntimeError(f"llama-cli failed ({run.returncode}): {run.stderr[-800:]}")
        ms, tokens = ms + float(found[-1].group(1)), tokens + int(found[-1].group(2))
    return {"plain_tokens_per_second": round(tokens / (ms / 1000), 2), "tokens": int(tokens)}


def _specdec(args, weights: str) -> dict:
    run = subprocess.run([sys.executable, "-m", "specdec", "demo", "--json", "--threads", str(args.threads),
                          "--gguf-weights", weights, "--max-new-tokens", str(args.tokens)],
                         capture_output=True, text=True, timeout=args.timeout, env=os.environ)
    if run.returncode:
        raise RuntimeError(f"specdec demo failed ({run.returncode}): {run.stderr[-800:]}")
    out = json.loads(run.stdout)
    return {k: out[k] for k in ("plain_tokens_per_second", "speculative_tokens_per_second", "identical") if k in out}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-cli", default="/work/llamacpp/build/bin/llama-cli")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--arms", default="llama,quantized,dequantized")
    parser.add_argument("--timeout", type=int, default=3600)
    args = parser.parse_args(argv)
    gguf, texts = _prompts(args.prompts)
    arms = args.arms.split(",")
    results: dict[str, list[dict]] = {arm: [] for arm in arms}
    for repeat in range(args.repeats):
        for arm in arms:
            start = time.time()
            row = _llama(args, gguf, texts) if arm == "llama" else _specdec(args, arm)
            row.update(arm=arm, repeat=repeat, wall_s=round(time.time() - start, 1),
                       load=round(os.getloadavg()[0], 1))
            results[arm].append(row)
            print(json.dumps(row), flush=True)
    summary = {}
    for arm, rows in results.items():
        for key in ("plain_tokens_per_second", "speculative_tokens_per_second"):
            values = [r[key] for r in rows if key in r]
            if values:
                summary[f"{arm}_{key}"] = {"median": statistics.median(values), "min": min(values),
                                           "max": max(values)}
    print(json.dumps({"summary": summary, "threads": args.threads, "repeats": args.repeats, "tokens": args.tokens,
                      "prompts": len(texts)}))


if __name__ == "__main__":
    main()
