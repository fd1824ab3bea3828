"""One engine per loaded model (issue 36 item 3): `specdec.load` holds one runner, whose one KV cache serves plain,
fixed-γ and "auto" requests in the same batches; a mixed batch's greedy text is each request's alone."""

import queue

import pytest

import specdec
from specdec.policy import DraftLengthPolicy
from specdec.request import SamplingParams

PROMPTS = ["w1 w2 w3", "w4 w5", "w2 w2 w9", "w7", "w3 w1", "w8 w8 w8"]
GAMMAS = [0, None, 1, "auto", 0, 3]  # plain, the model's default (2), fixed 1, the policy, plain, fixed 3
MAX_NEW = (48, 16, 16, 16, 16, 16)
NAMES_IT = r"(?s)(?=.*'heuristc')(?=.*heuristic, optimal, threshold, guarded)"  # the bad name and the valid ones


def run_together(llm, gammas, max_new=MAX_NEW) -> list:
    """Every prompt submitted at once (the first, plain and long, still runs when the others join) → completions."""
    outputs: queue.Queue = queue.Queue()
    requests = []
    for i, (prompt, gamma) in enumerate(zip(PROMPTS, gammas)):
        extra = {} if gamma is None else {"num_draft_tokens": gamma}
        ids, sampling, stop, g = llm.prepare(prompt, max_new_tokens=max_new[i], temperature=0, **extra)
        requests.append(llm.submit(ids, sampling, stop, g, outputs.put, request_id=f"r{i}"))
    by_id, pending = {r.request_id: r for r in requests}, len(requests)
    while pending:
        item = outputs.get(timeout=300)
        if isinstance(item, BaseException):
            raise item
        by_id[item.request_id].feed(item)
        pending -= bool(item.finished)
    return [r.completion() for r in requests]


def test_one_engine_one_cache_serves_plain_and_speculative_requests_in_the_same_steps(ckpt):
    with specdec.load(ckpt / "target", draft=ckpt / "draft", num_draft_tokens=2, max_batch_size=8,
                      dtype="float32") as llm:
        cache, runner = llm.kv_cache_bytes, llm.runner()
        assert llm.num_runners == 1 and cache > 0 and llm.runner_kind == "engine"
        steps, current = [], set()
        llm.driver.add_listener(lambda r, out: current.add(out.request_id))
        llm.driver.add_step_listener(lambda timing: (steps.append(set(current)), current.clear()))
        together = run_together(llm, GAMMAS)
        alone = [llm.generate(p, max_new_tokens=n, temperature=0, **({} if g is None else {"num_draft_tokens": g}))
                 for p, g, n in zip(PROMPTS, GAMMAS, MAX_NEW)]
        plain = [llm.generate(p, max_new_tokens=n, temperature=0, num_draft_tokens=0) for p, n in zip(PROMPTS, MAX_NEW)]
        assert llm.num_runners == 1 and llm.runner() is runner and llm.kv_cache_bytes == cache  # no second engine
    for mixed, one, reference, n in zip(together, alone, plain, MAX_NEW):
        assert mixed.token_ids == one.token_ids == reference.token_ids
        assert len(mixed.token_ids) == n or mixed.finish_reason == "stop"
    speculative = {f"r{i}" for i, g in enumerate(GAMMAS) if g != 0}
    assert any("r0" in step and step & speculative for step in steps)  # the plain row shared steps with drafting ones
    drafted = {f"r{i}": c.stats.num_draft_tokens for i, c in enumerate(together)}
    assert drafted["r0"] == drafted["r4"] == 0 and drafted["r5"] > 0  # plain rows drafted nothing in those steps


def test_a_request_gamma_is_checked_against_the_model(ckpt):
    from specdec.policy import HeuristicPolicy

    with specdec.load(ckpt / "target", draft=ckpt / "draft", num_draft_tokens=2, dtype="float32") as llm:
        assert llm.max_draft_tokens == 8
        with pytest.raises(ValueError, match="max_draft_tokens of 8"):
            llm.generate("w1", max_new_tokens=2, num_draft_tokens=9)
        for policy in ("Heuristic", HeuristicPolicy()):  # a policy is one γ per step for the batch: per model only
            with pytest.raises(ValueError, match=r"(?s)num_draft_tokens='(Heuristic|HeuristicPolicy)' for one request"
                                                 r".*whole batch.*a model's default"):
                llm.generate("w1", max_new_tokens=2, num_draft_tokens=policy)
        params = SamplingParams(max_new_tokens=2, num_draft_tokens=5)
        ids, sampling, stop, gamma = llm.prepare("w1", max_new_tokens=2, num_draft_tokens=5)
        assert sampling.num_draft_tokens == params.num_draft_tokens == gamma == 5
        assert llm.prepare("w1", max_new_tokens=2, num_draft_tokens=2)[1].num_draft_tokens is None  # (the default)
    with specdec.load(ckpt / "target", dtype="float32") as plain:
        assert plain.max_draft_tokens == 0
        with pytest.raises(ValueError, match="needs a draft model"):
            plain.generate("w1", max_new_tokens=2, num_draft_tokens=2)
        assert len(plain.generate("w1", max_new_tokens=3, num_draft_tokens=0, temperature=0).token_ids) == 3


def test_a_policy_name_runs_on_the_engine_and_its_greedy_text_is_plain_decodings(ckpt):
    """A default γ naming a draft-length policy ("heuristic") builds the engine, not the eager loop: the policy is
    the engine's (`engine.policy.set_fixed`), asked every speculative step, and the greedy tokens are plain
    decoding's. Negative control: a misspelled name is refused, naming it and the policy names."""
    from specdec.engine import Engine
    from specdec.policy import HeuristicPolicy
    from specdec.text.runner import RunnerSpec, build_runner

    with specdec.load(ckpt / "target", draft=ckpt / "draft", num_draft_tokens="heuristic", max_batch_size=4,
                      dtype="float32") as llm:
        engine = llm.runner()
        assert llm.runner_kind == "engine" and isinstance(engine, Engine)
        assert isinstance(engine.policy.loop.policy, HeuristicPolicy) and engine.policy.fixed is None
        named = [llm.generate(p, max_new_tokens=16, temperature=0) for p in PROMPTS[:3]]
        assert llm.prepare("w1", num_draft_tokens="Heuristic")[1].num_draft_tokens is None  # (the default as it is)
        plain = [llm.generate(p, max_new_tokens=16, temperature=0, num_draft_tokens=0) for p in PROMPTS[:3]]
        assert engine.policy.loop.asked  # the policy chose the speculative steps' γ
        assert sum(c.stats.num_draft_tokens for c in named) > 0
        assert [c.token_ids for c in named] == [c.token_ids for c in plain]
    with pytest.raises(ValueError, match=NAMES_IT):
        specdec.load(ckpt / "target", draft=ckpt / "draft", num_draft_tokens="heuristc", dtype="float32")
    with pytest.raises(ValueError, match=NAMES_IT):  # the runner's own check, below the entry point
        build_runner(llm.target, llm.drafter, RunnerSpec("auto", "heuristc", {}))


class _Countdown(DraftLengthPolicy):
    """A tiny policy of the protocol: γ 3, 1, 2, 3, 1, ... — counts its asks and the outcomes it is told."""

    def __init__(self):
        self.asks, self.told = 0, []

    def num_draft_tokens(self) -> int:
        self.asks += 1
        return 1 + self.asks % 3

    def update(self, outcome) -> None:
        self.told.append((outcome.num_draft_tokens, int(outcome.num_accepted.sum())))

    def reset(self) -> None:
        self.asks, self.told = 0, []


class _NoAsk:
    """Not a policy: no num_draft_tokens(), no confidence_threshold(), and not a DraftLengthPolicy."""

    def update(self, outcome) -> None: ...

    def reset(self) -> None: ...


def test_a_policy_object_runs_on_the_engine_asked_every_step_and_its_greedy_text_is_plain_decodings(ckpt):
    """A `DraftLengthPolicy` object as the model's default γ builds the engine (as a name does): the engine's policy
    is that object, asked before every speculative step and told each outcome, and the greedy tokens are plain
    decoding's. Negative controls: an object of another class is refused, naming the methods it lacks; a subclass
    that does not implement num_draft_tokens() is refused, naming it."""
    from specdec.engine import Engine

    policy = _Countdown()
    with specdec.load(ckpt / "target", draft=ckpt / "draft", num_draft_tokens=policy, max_batch_size=4,
                      dtype="float32") as llm:
        engine = llm.runner()
        assert llm.runner_kind == "engine" and isinstance(engine, Engine)
        assert engine.policy.loop.policy is policy and engine.policy.fixed is None
        chosen = [llm.generate(p, max_new_tokens=16, temperature=0) for p in PROMPTS[:3]]
        plain = [llm.generate(p, max_new_tokens=16, temperature=0, num_draft_tokens=0) for p in PROMPTS[:3]]
        speculative = len(engine.policy.loop.asked)
        assert speculative > 0 and policy.asks == speculative == len(policy.told)  # asked and told every step
        told = {g for g, _ in policy.told}  # (its asks, clamped to what the rows can still commit: 0 near the end)
        assert told <= {0, 1, 2, 3} and len(told - {0}) > 1
        assert sum(c.stats.num_draft_tokens for c in chosen) > 0
        assert [c.token_ids for c in chosen] == [c.token_ids for c in plain]
    with pytest.raises(ValueError, match=r"_NoAsk lacks num_draft_tokens\(\), confidence_threshold\(\)"):
        specdec.load(ckpt / "target", draft=ckpt / "draft", num_draft_tokens=_NoAsk(), dtype="float32")
    with pytest.raises(ValueError, match=r"_Bare does not implement num_draft_tokens\(\)"):
        specdec.load(ckpt / "target", draft=ckpt / "draft", num_draft_tokens=type("_Bare", (DraftLengthPolicy,), {})(),
                     dtype="float32")
