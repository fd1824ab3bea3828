"""The cost of grammar-constrained decoding, plain and speculative, on both runners.

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD python scripts/bench_constrained.py [--target DIR --draft DIR]
        [--device cpu|cuda] [--runners hf,fast] [--gamma 4] [--max-new-tokens 96] [--repeats 2] [--json out.json]

Default pair: the shipped demo pair (a 24-layer target, a 1-layer draft, an 8k BPE vocabulary). Each run: the same
prompts, greedy, batch 1, with and without a JSON-schema constraint, plain (γ = 0) and speculative (γ); tokens/s
is generated tokens over wall time (median over repeats, after one warm-up run); `grammar_s` is the time spent in
the grammar (`GrammarState.allowed` / `commit`: mask fills, matcher advance and rollback) and `mask_fills` the
masks computed. Constrained texts end when the JSON is complete, so tokens/s (not wall time) is what compares.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import transformers

import specdec
from specdec.constrain import Constraint, GrammarState, compile_constraint

DEMO = Path(__file__).resolve().parents[1] / "specdec" / "assets" / "demo_pair"
PROMPTS = ["A user record as JSON: ", "def load(path):\n    return ", "# config\n", "Example output:\n"]
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 24}, "id": {"type": "integer", "minimum": 0, "maximum": 99999},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
    "active": {"type": "boolean"}}, "required": ["name", "id", "tags", "active"]}


class _Timer:
    """Wall time inside GrammarState's methods (installed for the whole run)."""

    def __init__(self):
        self.seconds = 0.0
        for name in ("allowed", "commit"):
            original = getattr(GrammarState, name)

            def timed(state, *args, _original=original):
                start = time.perf_counter()
                try:
                    return _original(state, *args)
                finally:
                    self.seconds += time.perf_counter() - start

            setattr(GrammarState, name, timed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=str(DEMO / "target"))
    parser.add_argument("--draft", default=str(DEMO / "draft"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--runners", default="hf,fast")
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    tokenizer = transformers.AutoTokenizer.from_pretrained(args.target)
    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
    target = transformers.AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype).to(args.device).eval()
    draft = transformers.AutoModelForCausalLM.from_pretrained(args.draft, dtype=dtype).to(args.device).eval()
    vocab = target.get_output_embeddings().weight.shape[0]
    eos = [tokenizer.eos_token_id]
    start = time.perf_counter()
    grammar = compile_constraint(Constraint.json_schema(SCHEMA), tokenizer, vocab, eos)
    compile_s = time.perf_counter() - start
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    timer = _Timer()
    rows = []
    for runner in args.runners.split(","):
        for constrained in (False, True):
            for gamma in (0, args.gamma):
                kw = dict(max_new_tokens=args.max_new_tokens, temperature=0, num_draft_tokens=gamma, engine=runner,
                          eos_token_id=eos, constraint=grammar if constrained else None)
                drafter = draft if gamma else None
                specdec.generate(target, prompts[:1], drafter, **{**kw, "max_new_tokens": 8})  # warm-up
                rates, grammar_s, fills, texts = [], [], [], None
                for _ in range(args.repeats):
                    tokens, wall, timer.seconds, fills_before = 0, 0.0, 0.0, _fills()
                    outs = []
                    for prompt in prompts:
                        t0 = time.perf_counter()
                        result = specdec.generate(target, [prompt], drafter, **kw)
                        wall += time.perf_counter() - t0
                        tokens += len(result.sequences[0])
                        outs.append(result.sequences[0])
                    rates.append(tokens / wall)
                    grammar_s.append(timer.seconds)
                    fills.append(_fills() - fills_before)
                    texts = outs
                valid = None
                if constrained:
                    valid = sum(t[-1] == eos[0] and _is_json(tokenizer.decode(t[:-1])) for t in texts)
                row = {"runner": runner, "constrained": constrained, "gamma": gamma,
                       "tokens": sum(len(t) for t in texts), "tokens_per_s": round(statistics.median(rates), 2),
                       "grammar_s": round(statistics.median(grammar_s), 4), "mask_fills": fills[-1],
                       "complete_valid_json": valid, "prompts": len(prompts)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    report = {"device": args.device, "target": args.target, "draft": args.draft, "compile_s": round(compile_s, 3),
              "threads": torch.get_num_threads(), "rows": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


_FILLS: list = []


def _fills() -> int:
    return sum(s.mask_fills for s in _FILLS)


_init = GrammarState.__init__


def _tracked_init(self, grammar):
    _init(self, grammar)
    _FILLS.append(self)


GrammarState.__init__ = _tracked_init


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


if __name__ == "__main__":
    main()
