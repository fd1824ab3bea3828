"""Chat traffic through the engine, prefix caching on and off × speculation on and off, in one run.

The workload (`ChatSpec`, drawn once from its seed; every arm serves the same conversations): one shared system
prompt of `system_tokens` tokens; `conversations` conversations of `turns` (lo..hi) turns; each turn's prompt re-sends
the whole history — the system prompt, every earlier user message and the model's own answers — plus a new user
message of `user_tokens` tokens; answers of `answer_tokens` max_new_tokens (EOS also ends one), greedy. Arrivals:
`clients` conversations are in flight at once, the first ones joining one per engine step, a conversation's next
turn sent the moment its answer finished, a new conversation started when one ends — so requests arrive while
others run. Text is token ids glued together (no chat template between turns: the history is re-sent exactly).

Per arm (`ChatArm`: caching, speculation) a fresh engine (nothing cached from another arm), warmed up on a prompt
that shares nothing; reported: TTFT p50/p99 (add_request → first output with tokens), ITL p99 (between a request's
successive outputs: a step's tokens arrive together, the server's `inter_token_latency_seconds`), generated tokens
per second of wall time (and of the process's CPU time, `cpu_s`: steadier on a shared machine), the time spent
inside the prefix cache's own methods (`prefix_cache_s`, its host bookkeeping: what caching costs when nothing
hits, measured in the run), the prefix cache's hit rate (hit prompt tokens / prompt tokens looked up, vLLM's
prefix_cache_hits / prefix_cache_queries), tokens prefilled (the target's and the drafter's), and whether each
answer equals the caching-off arm's of the same speculation (exactness). `repeats` R: every arm run R times in
rotated orders, each figure the median over the runs with its range.

`random_prompts` (`--random-prompts`): the same arrivals, turns and answers, but nothing shared — each turn sends a
fresh prompt of random ids, as long as a first turn (`system_tokens` + a user message), and no history — so the
caching arms measure what the prefix cache costs when nothing hits (vLLM's random dataset; the target: throughput
within 2% of caching off, `throughput_caching_on_over_off_*` in the summary).
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["ChatSpec", "ChatArm", "ARMS", "QUICK", "chat_workload", "run_chat_arm", "run_chat", "quick_setup",
           "model_setup", "time_prefix_cache"]


@dataclass(frozen=True)
class ChatSpec:
    conversations: int = 64
    clients: int = 32  # conversations in flight at once
    turns: tuple[int, int] = (3, 8)  # per conversation, uniform
    system_tokens: int = 1000
    user_tokens: tuple[int, int] = (16, 64)  # a new user message, uniform
    answer_tokens: tuple[int, int] = (16, 64)  # max_new_tokens of a turn, uniform
    num_draft_tokens: int = 4  # γ of the speculative arms
    repeats: int = 1
    seed: int = 0
    random_prompts: bool = False  # nothing shared: each turn a fresh random prompt, no history (see the module doc)

    def __post_init__(self):
        for name in ("conversations", "clients", "system_tokens", "num_draft_tokens", "repeats"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        for name in ("turns", "user_tokens", "answer_tokens"):
            lo, hi = getattr(self, name)
            if not 1 <= lo <= hi:
                raise ValueError(f"{name} must be (lo, hi) with 1 <= lo <= hi, got {(lo, hi)}")
        if not isinstance(self.random_prompts, bool):
            raise TypeError(f"random_prompts must be True or False, got {self.random_prompts!r}")


@dataclass(frozen=True)
class ChatArm:
    caching: bool
    speculation: bool

    @property
    def name(self) -> str:
        return f"{'cache' if self.caching else 'no-cache'} / {'speculative' if self.speculation else 'plain'}"


ARMS = (ChatArm(False, False), ChatArm(True, False), ChatArm(False, True), ChatArm(True, True))


def chat_workload(spec: ChatSpec, texts: list[list[int]] | None, vocab: int) -> dict:
    """The conversations every arm serves: {"system": ids, "users": [[ids per turn] per conversation], "answers":
    [[max_new_tokens per turn] ...], "resend": whether a turn re-sends the history}. texts: token ids the system
    prompt and the user messages are cut from (a real tokenizer's prompts), None = random ids in [2, vocab).
    `spec.random_prompts`: no system prompt, each turn's message random ids of `system_tokens` + a user message's
    length (two fresh texts share no block: a block of 16 random ids repeats with probability ~vocab^-16)."""
    rng = random.Random(spec.seed)
    pool = [] if spec.random_prompts else [t for t in (texts or []) if t]

    def draw(n: int) -> list[int]:
        if not pool:
            return [rng.randrange(2, vocab) for _ in range(n)]
        out: list[int] = []
        while len(out) < n:
            text = pool[rng.randrange(len(pool))]
            start = rng.randrange(len(text))
            out += text[start : start + n - len(out)]
        return out

    system = [] if spec.random_prompts else draw(spec.system_tokens)
    extra = spec.system_tokens if spec.random_prompts else 0  # (a fresh prompt as long as a first turn)
    turns = [rng.randint(*spec.turns) for _ in range(spec.conversations)]
    users = [[draw(extra + rng.randint(*spec.user_tokens)) for _ in range(k)] for k in turns]
    answers = [[rng.randint(*spec.answer_tokens) for _ in range(k)] for k in turns]
    return {"system": system, "users": users, "answers": answers, "resend": not spec.random_prompts}


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


PREFIX_CACHE_METHODS = ("attach", "pending", "take_held", "commit_rows", "commit_row", "extend", "evict")


def time_prefix_cache(cache) -> list[float]:
    """Wrap the prefix cache's methods (this instance's) to add their seconds to the returned one-element list (the
    outermost call only: `take_held` runs `commit_rows`, `attach` an eviction)."""
    spent, depth = [0.0], [0]

    def timed(method):
        def run(*args, **kw):
            depth[0] += 1
            start = time.perf_counter()
            try:
                return method(*args, **kw)
            finally:
                depth[0] -= 1
                if not depth[0]:
                    spent[0] += time.perf_counter() - start
        return run

    for name in PREFIX_CACHE_METHODS:
        setattr(cache, name, timed(getattr(cache, name)))
    cache.pool.allocator.evict = cache.evict
    return spent


def run_chat_arm(engine, workload: dict, spec: ChatSpec, eos_ids=(), speculation: bool = True) -> tuple[dict, list]:
    """One arm on a fresh `engine` → (its row, every turn's answer tokens in (conversation, turn) order)."""
    from specdec.request import SamplingParams

    gamma = spec.num_draft_tokens if speculation else 0

    def params(max_new: int) -> SamplingParams:
        return SamplingParams(temperature=0.0, max_new_tokens=max_new, eos_token_ids=tuple(eos_ids),
                              num_draft_tokens=gamma if engine.drafter is not None else None)

    warm = engine.add_request([3 + (i * 7) % 50 for i in range(24)], params(4))  # (shares nothing with the chats)
    while engine.has_unfinished():
        engine.step()
    del warm
    queries0, hits0, fed0 = engine.prefix_cache_queries, engine.prefix_cache_hits, engine.prefill_tokens
    users, budgets, resend = workload["users"], workload["answers"], workload.get("resend", True)
    history = {c: list(workload["system"]) for c in range(len(users))}
    turn = {c: 0 for c in range(len(users))}
    answers: dict[tuple, list[int]] = {}
    owner, sent_at, last_at = {}, {}, {}
    ttft, itl, cached = [], [], []
    waiting = list(range(len(users)))
    active: set[int] = set()
    prompt_tokens = 0

    def send(c: int) -> None:
        nonlocal prompt_tokens
        prompt = (history[c] if resend else []) + users[c][turn[c]]
        history[c] = prompt
        rid = engine.add_request(prompt, params(budgets[c][turn[c]]))
        owner[rid], sent_at[rid] = c, time.perf_counter()
        answers[(c, turn[c])] = []
        prompt_tokens += len(prompt)

    spent = time_prefix_cache(engine.prefix_cache) if engine.prefix_cache is not None else [0.0]
    start, cpu = time.perf_counter(), time.process_time()
    while waiting or active:
        if waiting and len(active) < spec.clients:  # (one conversation joins per step: arrivals while others run)
            c = waiting.pop(0)
            active.add(c)
            send(c)
        outputs = engine.step()
        now = time.perf_counter()
        for out in outputs:
            c = owner[out.request_id]
            if out.new_token_ids:
                answers[(c, turn[c])].extend(out.new_token_ids)
                if out.request_id in last_at:
                    itl.append(now - last_at[out.request_id])
                else:
                    ttft.append(now - sent_at[out.request_id])
                last_at[out.request_id] = now
            if out.finished:
                cached.append(out.num_cached_tokens)
                history[c] = history[c] + answers[(c, turn[c])]
                turn[c] += 1
                if turn[c] < len(users[c]):
                    send(c)
                else:
                    active.discard(c)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    queries, hits = engine.prefix_cache_queries - queries0, engine.prefix_cache_hits - hits0
    generated = sum(len(a) for a in answers.values())
    row = {"requests": len(answers), "prompt_tokens": prompt_tokens, "generated_tokens": generated,
           "prefill_tokens": engine.prefill_tokens - fed0, "prefix_cache_queries": queries,
           "prefix_cache_hits": hits, "hit_rate": hits / queries if queries else 0.0,
           "cached_tokens_per_request": sum(cached) / len(cached) if cached else 0.0,
           "ttft_p50_s": _percentile(ttft, 50), "ttft_p99_s": _percentile(ttft, 99), "itl_p99_s": _percentile(itl, 99),
           "throughput_tok_s": generated / seconds if seconds else None, "wall_s": seconds, "cpu_s": cpu,
           "tokens_per_cpu_s": generated / cpu if cpu else None, "prefix_cache_s": spent[0],
           "prefix_cache_share": spent[0] / seconds if seconds else None}
    return row, [answers[k] for k in sorted(answers)]


_TIMED = ("ttft_p50_s", "ttft_p99_s", "itl_p99_s", "throughput_tok_s", "wall_s", "cpu_s", "tokens_per_cpu_s",
          "prefix_cache_s", "prefix_cache_share")


def run_chat(make_engine, spec: ChatSpec, workload: dict, eos_ids=(), arms=ARMS, log=None) -> dict:
    """Every arm (`make_engine(arm)` → a fresh engine, released after) `spec.repeats` times in rotated orders →
    {"spec", "rows" (per arm: the median run's counts, each timed figure's median and range), "summary"}."""
    runs: dict[ChatArm, list] = {arm: [] for arm in arms}
    tokens: dict[ChatArm, list] = {}
    for r in range(spec.repeats):
        order = list(arms[r % len(arms):]) + list(arms[: r % len(arms)])
        for arm in order:
            engine = make_engine(arm)
            row, answers = run_chat_arm(engine, workload, spec, eos_ids, speculation=arm.speculation)
            del engine
            runs[arm].append(row)
            tokens.setdefault(arm, answers)
            if log is not None:
                log(f"{arm.name} (run {r + 1}/{spec.repeats}): hit rate {row['hit_rate']:.3f}, TTFT p50 "
                    f"{row['ttft_p50_s']:.4f} s, {row['throughput_tok_s']:.1f} tok/s")
    rows = []
    for arm in arms:
        first = runs[arm][0]
        row = {"arm": arm.name, "caching": arm.caching, "speculation": arm.speculation,
               **{k: v for k, v in first.items() if k not in _TIMED}}
        for key in _TIMED:
            values = [run[key] for run in runs[arm] if run[key] is not None]
            row[key] = statistics.median(values) if values else None
            row[key + "_range"] = [min(values), max(values)] if values else None
        reference = ChatArm(False, arm.speculation)
        row["tokens_equal_caching_off"] = tokens.get(reference) == tokens[arm] if reference in tokens else None
        rows.append(row)
    return {"spec": asdict(spec), "rows": rows, "summary": _summary(rows)}


def _summary(rows: list[dict]) -> dict:
    by = {(r["caching"], r["speculation"]): r for r in rows}
    out = {}
    for spec_on in (False, True):
        on, off = by.get((True, spec_on)), by.get((False, spec_on))
        if on and off and on["ttft_p50_s"] and off["ttft_p50_s"]:
            out[f"ttft_p50_x_lower_with_caching_{'speculative' if spec_on else 'plain'}"] = \
                off["ttft_p50_s"] / on["ttft_p50_s"]
    if (True, True) in by and (True, False) in by:
        out["hit_rate_points_speculative_minus_plain"] = 100 * (by[(True, True)]["hit_rate"] - by[(True, False)]["hit_rate"])
    for spec_on in (False, True):  # (the cost of caching where nothing hits: --random-prompts)
        on, off = by.get((True, spec_on)), by.get((False, spec_on))
        name = "speculative" if spec_on else "plain"
        if on and off and on["throughput_tok_s"] and off["throughput_tok_s"]:
            out[f"throughput_caching_on_over_off_{name}"] = on["throughput_tok_s"] / off["throughput_tok_s"]
        if on and off and on["tokens_per_cpu_s"] and off["tokens_per_cpu_s"]:
            out[f"tokens_per_cpu_s_caching_on_over_off_{name}"] = on["tokens_per_cpu_s"] / off["tokens_per_cpu_s"]
        if on and on["prefix_cache_share"] is not None:
            out[f"prefix_cache_share_of_wall_{name}"] = on["prefix_cache_share"]
    plain, spec = by.get((True, False)), by.get((True, True))
    if plain and spec and plain["itl_p99_s"] and spec["itl_p99_s"]:
        out["itl_p99_speculative_over_plain_with_caching"] = spec["itl_p99_s"] / plain["itl_p99_s"]
    return out


#: `specdec bench --preset chat --quick`: tiny random Llamas on CPU, a check of the harness, not a speed claim
QUICK = dict(conversations=3, clients=2, turns=(3, 3), system_tokens=64, user_tokens=(4, 8), answer_tokens=(3, 6),
             num_draft_tokens=3)


def engine_config(spec: ChatSpec, arm: ChatArm, max_seq_len: int, **kw):
    """The arm's engine options: the paged pool, prefix caching per arm, slots for every client, γ ≤ the spec's."""
    from specdec.engine import EngineConfig
    from specdec.engine.config import BATCH_BUCKETS

    batch = next((b for b in BATCH_BUCKETS if b >= spec.clients), BATCH_BUCKETS[-1])
    return EngineConfig(max_batch_size=batch, max_seq_len=max_seq_len, kv_layout="paged",
                        enable_prefix_caching=arm.caching, num_draft_tokens=spec.num_draft_tokens if arm.speculation
                        else 0, max_draft_tokens=spec.num_draft_tokens, **kw)


def longest_text(spec: ChatSpec) -> int:
    """The longest conversation's text: the system prompt and every turn at its largest, + one step's margin."""
    return spec.system_tokens + spec.turns[1] * (spec.user_tokens[1] + spec.answer_tokens[1]) + 16


def quick_setup(spec: ChatSpec, drafter: str = "model"):
    """(make_engine, texts, vocab, eos_ids, notes) over tiny random Llamas (a 4-layer target; drafter "model": a
    perturbed 2-layer copy, α high; "head": an untrained feature head from the target's last layer)."""
    from specdec.bench.traffic_setup import quick_models
    from specdec.engine import Engine

    target, draft, head = quick_models(with_head=drafter == "head")
    proposer = head if drafter == "head" else draft
    length = longest_text(spec)

    def make_engine(arm: ChatArm):
        return Engine(target, proposer if arm.speculation else None, engine_config(spec, arm, length))

    return make_engine, None, target.config.vocab_size, (), [
        f"quick: tiny random Llamas on CPU ({drafter} drafter): a check of the harness, not a speed claim"]


def model_setup(spec: ChatSpec, target, draft, device):
    """(make_engine, texts, vocab, eos_ids, notes) for a real model (`target`: a GGUF file or transformers folder)
    and the drafter trained for it (`draft`: a feature head folder or a draft model folder); bf16 on CUDA, fp32 on
    the CPU; the system prompt and user messages are cut from chat and code prompts through its chat template."""
    import torch

    from specdec.bench.traffic_setup import chat_pool, draft_kind
    from specdec.engine import Engine
    from specdec.loading import load_model, load_tokenizer
    from specdec.zoo.responses import stop_token_ids

    dtype = "bfloat16" if device.type == "cuda" else "float32"
    model = load_model(target, device=device, dtype=dtype, what="target").eval()
    tokenizer = load_tokenizer(target, what="target")
    kind = draft_kind(draft)
    proposer = str(draft) if kind == "head" else load_model(draft, device=device, dtype=dtype, what="draft").eval()
    context = int(getattr(model.config, "max_position_embeddings", None) or 8192)
    length = longest_text(spec)
    if length > context:
        raise ValueError(f"the longest conversation takes {length} tokens; the model's context is {context} "
                         "(fewer --turns, --system-tokens or --new-tokens)")

    def make_engine(arm: ChatArm):
        return Engine(model, proposer if arm.speculation else None, engine_config(spec, arm, length))

    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    return make_engine, chat_pool(tokenizer), model.config.vocab_size, tuple(stop_token_ids(model, tokenizer)), [
        f"target {Path(target).name} ({dtype}) on {where}, drafter {Path(draft).name} ({kind}); system prompt and "
        "user messages cut from chat/code prompts through its chat template, turns glued as token ids"]
