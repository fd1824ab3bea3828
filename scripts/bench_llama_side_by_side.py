"""llama.cpp beside specdec on the chat demo's GGUF (SmolLM2-135M-Instruct Q4_1): greedy tokens/s, same prompts, same
threads, same file, the arms interleaved and repeated (the machine may be shared: the ratio within one run is the
figure, quote medians and ranges).

    python scripts/bench_llama_side_by_side.py --llama-python /work/llama-venv/bin/python \
        [--gguf PATH] [--threads 2] [--repeats 3] [--tokens 128] [--prompts 6] [--arms llama,quantized,dequantized]

Arms, each run as its own process per repeat, their order reversed every other repeat:
  llama        llama.cpp through llama-cpp-python (installed apart, e.g. `CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON
               -DGGML_AVX512=ON -DGGML_AMX_INT8=OFF -DGGML_OPENMP=OFF" pip install llama-cpp-python` into its own
               venv; not a dependency of specdec): each chat-formatted prompt (the demo's template, rendered by
               specdec's tokenizer, tokenized by llama.cpp with its special tokens), greedy (`temp=0`), up to TOKENS
               tokens or its end-of-turn token; tokens/s = the tokens after the first / the time after the first (the
               generation only, as specdec's figure leaves the prefill out), summed over the prompts
  quantized    `specdec demo --json --target GGUF --threads THREADS --gguf-weights quantized --prompt ...`: plain and
               speculative tokens/s (the shipped head, γ 4), whether their texts are identical
  dequantized  the same with `--gguf-weights dequantized` (float32 weights, oneDNN)
One JSON line per run, then a summary line (median, min, max per arm and figure, and the ratios to llama's plain
tokens/s). Benchmarks are not tests: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

DEFAULT_GGUF = "/work/models/smol/SmolLM2-135M-Instruct.Q4_1.gguf"

# run by --llama-python: argv = gguf, threads, tokens; stdin = JSON list of prompt texts; stdout = one JSON line
_LLAMA = r"""
import json, sys, time
from llama_cpp import Llama
gguf, threads, tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
llm = Llama(model_path=gguf, n_threads=threads, n_threads_batch=threads, n_ctx=2048, verbose=False)
end = llm.token_eos()
stops = {end} | {t for t in llm.tokenize(b"<|im_end|>", add_bos=False, special=True)[:1]}
generated = seconds = 0.0
for text in json.loads(sys.stdin.read()):
    ids = llm.tokenize(text.encode(), add_bos=False, special=True)
    llm.reset()
    n, first = 0, None
    for tok in llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, repeat_penalty=1.0, reset=True):
        now = time.perf_counter()
        first = now if first is None else first
        n += 1
        if tok in stops or n >= tokens:
            break
    generated += n - 1
    seconds += now - first
print(json.dumps({"plain_tokens_per_second": round(generated / seconds, 2), "tokens": int(generated)}))
"""


def _prompts(gguf: str, n: int) -> tuple[list[str], list[str]]:
    """(the demo's first n prompts, their chat-formatted texts)."""
    from pathlib import Path

    from specdec.loading import load_tokenizer
    from specdec.zoo.instructions import DEMO_PROMPTS

    tokenizer = load_tokenizer(Path(gguf), what="target")
    prompts = list(DEMO_PROMPTS)[:n]
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                           tokenize=False) for p in prompts]
    return prompts, texts


def _llama(args, texts: list[str]) -> dict:
    run = subprocess.run([args.llama_python, "-c", _LLAMA, args.gguf, str(args.threads), str(args.tokens)],
                         input=json.dumps(texts), capture_output=True, text=True, timeout=args.timeout)
    if run.returncode:
        raise RuntimeError(f"llama-cpp-python failed ({run.returncode}): {run.stderr[-800:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def _specdec(args, weights: str, prompts: list[str]) -> dict:
    command = [sys.executable, "-m", "specdec", "demo", "--json", "--quiet", "--target", args.gguf, "--threads",
               str(args.threads), "--gguf-weights", weights, "--max-new-tokens", str(args.tokens)]
    for prompt in prompts:
        command += ["--prompt", prompt]
    run = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout, env=os.environ)
    if run.returncode:
        raise RuntimeError(f"specdec demo failed ({run.returncode}): {run.stderr[-800:]}")
    out = json.loads(run.stdout.strip().splitlines()[-1])
    return {k: out[k] for k in ("plain_tokens_per_second", "speculative_tokens_per_second", "identical") if k in out}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-python", default="/work/llama-venv/bin/python",
                        help="a Python with llama-cpp-python installed")
    parser.add_argument("--gguf", default=DEFAULT_GGUF)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--arms", default="llama,quantized,dequantized")
    parser.add_argument("--timeout", type=int, default=3600)
    args = parser.parse_args(argv)
    prompts, texts = _prompts(args.gguf, args.prompts)
    arms = args.arms.split(",")
    results: dict[str, list[dict]] = {arm: [] for arm in arms}
    for repeat in range(args.repeats):
        for arm in arms if repeat % 2 == 0 else arms[::-1]:
            start, load = time.time(), os.getloadavg()[0]
            row = _llama(args, texts) if arm == "llama" else _specdec(args, arm, prompts)
            row.update(arm=arm, repeat=repeat, wall_s=round(time.time() - start, 1), load_before=round(load, 1),
                       load_after=round(os.getloadavg()[0], 1))
            results[arm].append(row)
            print(json.dumps(row), flush=True)
    summary = {}
    for arm, rows in results.items():
        for key in ("plain_tokens_per_second", "speculative_tokens_per_second"):
            values = [r[key] for r in rows if key in r]
            if values:
                summary[f"{arm}_{key}"] = {"median": statistics.median(values), "min": min(values),
                                           "max": max(values)}
    if "llama" in results:  # ratios repeat by repeat (the same stretch of load), then their median
        for arm, rows in results.items():
            for key in ("plain_tokens_per_second", "speculative_tokens_per_second"):
                ratios = [r[key] / base["plain_tokens_per_second"] for r, base in zip(rows, results["llama"])
                          if key in r and arm != "llama"]
                if ratios:
                    summary[f"{arm}_{key.split('_')[0]}_vs_llama_plain"] = round(statistics.median(ratios), 3)
    print(json.dumps({"summary": summary, "threads": args.threads, "repeats": args.repeats, "tokens": args.tokens,
                      "prompts": len(texts)}))


if __name__ == "__main__":
    main()
