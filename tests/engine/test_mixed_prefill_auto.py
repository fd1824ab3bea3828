"""The mixed step's "auto" prefill budget (`prefill_budget="auto"`, `engine/prefill_budget.py`): the same tokens as
a whole prefill (greedy and seeded T = 1, model drafter and feature head, fixed γ and "auto"), the stall bound (no
step feeds more than the budget it announced before the step, unless a deadline asked for more; negative control:
budget off), no
starvation (a burst of long prompts is fed within `prefill_steps` K steps of its admission; negative control: a
deadline far away leaves them filling longer), what it measures, and the options' validation.

What "auto" measures on this CPU is launch noise (a 16-token feed: 0.6–1.6 ms), so the engine-level tests pin
`AutoBudget.budget` (the public class the engine asks each step) to a small number: they test how the engine uses
the budget it is given; tests/engine/test_prefill_budget.py tests the arithmetic on synthetic costs."""

import pytest

from specdec.engine.prefill_budget import AutoBudget
from prefill_helpers import drive as _drive
from prefill_helpers import head as _head
from prefill_helpers import mixed_params as _mixed_params
from prefill_helpers import prompt as _prompt
from specdec.engine import Engine, EngineConfig
from specdec.request import SamplingParams


@pytest.fixture
def small(monkeypatch):
    """"auto" announces 16 tokens a step, whatever this CPU measured."""
    monkeypatch.setattr(AutoBudget, "budget", lambda self, step_seconds=None: 16)


@pytest.mark.parametrize("drafter", ["model", "head"])
@pytest.mark.parametrize("gamma", [3, "auto"])
def test_the_auto_budget_gives_the_tokens_of_a_whole_prefill(make_llama, drafter, gamma, small):
    target = make_llama(0)
    draft = make_llama(5, layers=1) if drafter == "model" else _head(target)
    early = [_prompt(5, 1), _prompt(9, 2)]
    late = [_prompt(70, 3), _prompt(4, 4), _prompt(41, 5), _prompt(12, 6)]
    params = _mixed_params(len(early) + len(late))
    runs, filling = [], []
    for budget in (None, "auto"):  # a tiny stall: the floor of 16 tokens a step on this CPU, prompts across steps
        engine = Engine(target, draft, EngineConfig(max_batch_size=4, max_seq_len=128, num_draft_tokens=gamma,
                                                    admit_min=1, prefill_budget=budget, mixed_step=bool(budget),
                                                    prefill_stall=0.01 if budget else None, prefill_steps=50 if budget else None))
        runs.append(_drive(engine, early, late, params, watch=lambda e, _: filling.append(e.num_prefilling)))
    assert max(filling) >= 1  # the auto run did fill requests across steps
    compared = range(len(params)) if gamma != "auto" else range(0, len(params), 2)  # auto: γ follows the clock
    for i in compared:
        assert runs[1][i] == runs[0][i], (i, params[i].temperature)


def _long_prompt_run(make_llama, budget, steps):
    """4 rows running, a 2,000-token prompt admitted at step 2 → (tokens, per step: (the budget announced before it,
    None when no row ran; tokens fed), stalled request ids, the engine)."""
    target, draft = make_llama(0), make_llama(5, layers=1)
    for model in (target, draft):
        model.config.max_position_embeddings = 2304
    early = [_prompt(6 + i, 10 + i) for i in range(4)]
    params = [SamplingParams(temperature=0, max_new_tokens=100)] * 4 + [SamplingParams(temperature=0, max_new_tokens=8)]
    engine = Engine(target, draft, EngineConfig(max_batch_size=5, max_seq_len=2048, num_draft_tokens=2, admit_min=1,
                                                prefill_budget=budget, prefill_steps=steps, mixed_step=bool(budget),
                                                prefill_stall=0.05 if budget == "auto" else None))
    steps_seen, stalled, seen = [], [], {"fed": 0, "announced": engine.step_prefill_budget, "running": 0}

    def watch(e, outs):  # (with no row running, nothing waits: whatever fills is fed at once)
        steps_seen.append((seen["announced"] if seen["running"] else None, e.prefill_tokens - seen["fed"]))
        seen.update(fed=e.prefill_tokens, announced=e.step_prefill_budget, running=e.num_running)
        if e.num_prefilling:
            stalled.extend(o.request_id for o in outs if not o.new_token_ids and not o.finished)

    tokens = _drive(engine, early, [_prompt(2000, 7)], params, join_after=2, watch=watch)
    return tokens, steps_seen, stalled, engine


def test_the_auto_budget_bounds_what_a_step_prefills(make_llama, small):
    """With "auto" (a deadline far away) no step past the admission feeds more than the budget it announced before
    it, while a 2,000-token prompt fills over many steps and every running row produces a token every step; the
    budget is measured (decode step, prefill rate). Negative control: budget off, one step feeds the whole prompt."""
    tokens, steps, stalled, engine = _long_prompt_run(make_llama, "auto", 1024)
    fed_steps = [(announced, fed) for announced, fed in steps[3:] if fed and announced is not None]
    assert len(fed_steps) >= 4  # spread over steps
    assert all(fed <= announced for announced, fed in fed_steps), [s for s in fed_steps if s[1] > s[0]]
    assert stalled == []
    whole, off_steps, _, _ = _long_prompt_run(make_llama, None, None)
    assert max(fed for _, fed in off_steps[2:]) >= 2 * 2000 - 3  # the control: target and drafter in one step
    assert tokens == whole


def test_the_auto_budget_feeds_every_request_within_k_steps(make_llama, small):
    """No starvation: a burst of long prompts admitted beside running rows is fed in full within K = prefill_steps
    steps of its admission, whatever the measured budget (a tiny stall: 16 tokens a step); the tokens are those of a
    whole prefill; "auto" without `prefill_steps` has K = 4. Negative control: with the deadline far away the same
    burst fills for many more steps."""
    target, draft = make_llama(0), make_llama(5, layers=1)
    early = [_prompt(5, 1), _prompt(7, 2)]
    late = [_prompt(90, 3), _prompt(70, 4), _prompt(50, 5), _prompt(30, 6)]
    params = _mixed_params(len(early) + len(late), max_new=30)
    runs, filled = [], {}
    for budget, steps in ((None, None), ("auto", 3), ("auto", 1000), ("auto", None)):
        engine = Engine(target, draft, EngineConfig(max_batch_size=6, max_seq_len=160, num_draft_tokens=3, admit_min=1,
                                                    prefill_budget=budget, prefill_steps=steps, mixed_step=bool(budget),
                                                    prefill_stall=0.01 if budget else None))
        filling = []
        runs.append(_drive(engine, early, late, params, join_after=2,
                           watch=lambda e, _, filling=filling: filling.append(e.num_prefilling)))
        filled[steps] = sum(1 for f in filling if f)
    assert runs[1] == runs[0] and runs[2] == runs[0] and runs[3] == runs[0]
    assert 1 <= filled[3] <= 2  # filling for at most K - 1 steps past its admission step
    assert 1 <= filled[None] <= 3  # "auto"'s default deadline: K = 4
    assert filled[1000] > 4  # the control


def test_the_auto_budget_is_cold_until_measured_and_a_fixed_one_is_announced_as_is(make_llama):
    engine = Engine(make_llama(0), None, EngineConfig(max_batch_size=2, max_seq_len=64, prefill_budget="auto"))
    assert engine.prefill_budget == "auto" and engine.step_prefill_budget == 512  # cold: nothing measured yet
    assert engine.prefill_report["budget"] == 512 and engine.prefill_report["stall"] == 0.5
    engine.add_request(_prompt(20, 1), SamplingParams(temperature=0, max_new_tokens=12))
    for _ in range(3):
        engine.step()
    engine.add_request(_prompt(40, 2), SamplingParams(temperature=0, max_new_tokens=4))
    while engine.has_unfinished():
        engine.step()
    report = engine.prefill_report  # measured: the decode steps, the prefills (the whole one and the chunks)
    assert report["decode_step_ms"] > 0 and report["prefill_us_per_token"] > 0 and report["budget"] >= 16
    fixed = Engine(make_llama(0), None, EngineConfig(max_batch_size=2, max_seq_len=64, prefill_budget=32))
    assert fixed.step_prefill_budget == 32 and fixed.prefill_report is None


@pytest.mark.parametrize("kwargs, fragment", [
    ({"prefill_budget": 64, "prefill_stall": 0.5}, "prefill_stall=0.5 needs prefill_budget='auto'"),
    ({"mixed_step": False, "prefill_stall": 0.5}, "prefill_stall"),
    ({"prefill_budget": "auto", "prefill_stall": 0}, "prefill_stall"),
    ({"prefill_budget": "auto", "prefill_stall": True}, "prefill_stall"),
    ({"prefill_budget": "auto", "prefill_stall": "half"}, "prefill_stall"),
    ({"prefill_budget": "auto", "prefill_stall": float("nan")}, "prefill_stall"),
    ({"prefill_budget": "auto", "prefill_steps": 0}, "prefill_steps"),
])
def test_the_auto_options_are_checked_before_anything_allocates(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        EngineConfig(**kwargs)
