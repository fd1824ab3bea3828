"""Chat-shaped traffic through the paged engine with prefix caching on and off, speculation on and off (CPU, tiny
random Llama models): a shared system prompt, conversations of several turns each re-sending its history (the
previous turns' prompts and answers) plus a new user message, each conversation's next turn sent when its last
answer finished, several conversations at once. Prints one JSON line per arm: the prefix cache's hit rate (hit
tokens / prompt tokens looked up), tokens prefilled, wall seconds, and whether the tokens equal caching off's.

    PYTHONPATH=. python scripts/prefix_chat_traffic.py --conversations 6 --turns 4
"""

from __future__ import annotations

import argparse
import json
import random
import time

import torch
import transformers

from specdec.engine import Engine, EngineConfig
from specdec.request import SamplingParams


def tiny_llama(seed: int, layers: int, vocab: int, hidden: int = 64) -> transformers.LlamaForCausalLM:
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=2048)
    return transformers.LlamaForCausalLM(config).eval()


def run_arm(target, drafter, args, caching: bool, gamma: int) -> tuple[dict, dict]:
    config = EngineConfig(max_batch_size=args.max_batch, max_seq_len=args.max_seq_len, kv_layout="paged",
                          block_size=args.block_size, enable_prefix_caching=caching,
                          num_draft_tokens=gamma if drafter is not None else 0, kernels="reference")
    engine = Engine(target, drafter, config)
    rng = random.Random(args.seed)
    system = [rng.randrange(2, args.vocab) for _ in range(args.system)]
    users = [[[rng.randrange(2, args.vocab) for _ in range(args.user)] for _ in range(args.turns)]
             for _ in range(args.conversations)]
    history = {c: list(system) for c in range(args.conversations)}
    turn = {c: 0 for c in range(args.conversations)}
    owner, answers, tokens, sent = {}, {}, {}, [0]

    def send(c: int) -> None:
        prompt = history[c] + users[c][turn[c]]
        rid = engine.add_request(prompt, SamplingParams(temperature=args.temperature, max_new_tokens=args.answer,
                                                        seed=1000 * c + turn[c]))
        owner[rid], answers[rid], history[c] = c, [], prompt
        sent[0] += len(prompt)

    start = time.perf_counter()
    for c in range(args.conversations):
        send(c)
    while engine.has_unfinished():
        for out in engine.step():
            answers[out.request_id].extend(out.new_token_ids)
            if out.finished:
                c = owner[out.request_id]
                tokens[(c, turn[c])] = answers[out.request_id]
                history[c] = history[c] + answers[out.request_id]
                turn[c] += 1
                if turn[c] < args.turns:
                    send(c)
    seconds = time.perf_counter() - start
    queries, hits = engine.prefix_cache_queries, engine.prefix_cache_hits
    row = {"caching": caching, "speculation": drafter is not None and gamma > 0, "gamma": gamma if drafter else 0,
           "prompt_tokens": sent[0], "prefill_tokens": engine.prefill_tokens,
           "prefix_cache_queries": queries, "prefix_cache_hits": hits,
           "hit_rate": round(hits / queries, 4) if queries else None, "wall_s": round(seconds, 2),
           "generated": sum(len(t) for t in tokens.values())}
    return row, tokens


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=6)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--system", type=int, default=256, help="tokens of the shared system prompt")
    parser.add_argument("--user", type=int, default=24, help="tokens of each user message")
    parser.add_argument("--answer", type=int, default=32, help="tokens generated per turn")
    parser.add_argument("--max-batch", type=int, default=4)
    parser.add_argument("--max-seq-len", type=int, default=1024)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--gamma", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    target, draft = tiny_llama(0, 2, args.vocab), tiny_llama(1, 1, args.vocab)
    rows = []
    with torch.inference_mode():
        for drafter in (None, draft):
            reference = None
            for caching in (False, True):
                row, tokens = run_arm(target, drafter, args, caching, args.gamma)
                reference = tokens if reference is None else reference
                row["tokens_equal_caching_off"] = tokens == reference
                rows.append(row)
                print(json.dumps(row))
    return rows


if __name__ == "__main__":
    main()
