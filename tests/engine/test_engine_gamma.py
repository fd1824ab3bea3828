"""γ belongs to the request (issue 36 item 3): one engine serves plain, fixed-γ and "auto" requests in one batch, each
row verifying at most its own cap (`SamplingParams.num_draft_tokens`) and what its budget can still commit (issue 35
item 9). Greedy tokens do not depend on the caps beside a request; a seeded sampled request with a fixed cap draws the
same tokens alone or in any mix; the loop and the engine report the same drafted / accepted counts at a budget's end.
CPU, fp32, every request seeded."""

import pytest
import torch

import specdec
from specdec.engine import Engine, EngineConfig
from specdec.request import SamplingParams

PROMPTS = [[5, 6, 7, 8], [1, 2], [9, 9, 9, 9], [3] * 12, [4, 4, 9], [11, 12, 13]]
CAPS = [0, 3, "auto", None, 1, 0]  # plain, fixed 3, the policy, the engine's default, fixed 1, plain


@pytest.fixture(scope="module")
def pair(peaked_pair):
    return peaked_pair


def run_all(engine: Engine, requests) -> dict[str, dict]:
    """Run (prompt, params) requests to the end → request id → {tokens, drafted: per output, accepted: per output}."""
    ids = [engine.add_request(prompt, params) for prompt, params in requests]
    seen = {rid: {"tokens": [], "drafted": [], "accepted": []} for rid in ids}
    while engine.has_unfinished():
        for out in engine.step():
            seen[out.request_id]["tokens"] += out.new_token_ids
            seen[out.request_id]["drafted"].append(out.num_drafted)
            seen[out.request_id]["accepted"].append(out.num_accepted)
    return [seen[rid] for rid in ids]


def engine_of(pair, default="auto", batch: int = 8, drafter: bool = True) -> Engine:
    target, draft = pair
    return Engine(target, draft if drafter else None,
                  EngineConfig(max_batch_size=batch, max_seq_len=128, num_draft_tokens=default, max_draft_tokens=8))


def test_a_mixed_batchs_greedy_tokens_equal_each_request_alone_and_plain_decoding(pair):
    requests = [(p, SamplingParams(temperature=0, max_new_tokens=14 + i, num_draft_tokens=c))
                for i, (p, c) in enumerate(zip(PROMPTS, CAPS))]
    mixed = run_all(engine_of(pair), requests)
    plain = run_all(engine_of(pair, drafter=False), [(p, SamplingParams(temperature=0, max_new_tokens=r.max_new_tokens))
                                                     for p, (_, r) in zip(PROMPTS, requests)])
    for i, request in enumerate(requests):
        alone = run_all(engine_of(pair, batch=1), [request])[0]
        assert mixed[i]["tokens"] == alone["tokens"] == plain[i]["tokens"], i
        cap = CAPS[i]
        if cap == 0:  # plain rows draft nothing in the speculative steps they share
            assert sum(mixed[i]["drafted"]) == 0
        elif isinstance(cap, int):
            assert max(mixed[i]["drafted"]) <= cap and sum(mixed[i]["accepted"]) > 0
    assert sum(sum(m["accepted"]) for m in mixed) > 0  # (speculation ran: a real mix, not plain steps only)


def test_a_seeded_request_with_a_fixed_cap_samples_the_same_tokens_in_any_mix(pair):
    """Its cap, not the step's γ, sets its draws: alone on an "auto" engine, beside plain / auto / other caps (whose
    steps run γ up to 8), and on an engine whose default is another fixed γ. Negative control: cap 1 draws other
    tokens (so equality is not the law's accident)."""
    mine = SamplingParams(temperature=1.0, top_k=40, max_new_tokens=20, seed=3, num_draft_tokens=3)
    crowd = [(p, SamplingParams(temperature=0.9 if i % 2 else 0, max_new_tokens=10 + 3 * i, seed=100 + i,
                                num_draft_tokens=c))
             for i, (p, c) in enumerate(zip(PROMPTS[1:], ["auto", 0, 8, None, 1]))]
    alone = run_all(engine_of(pair, batch=1), [(PROMPTS[0], mine)])[0]["tokens"]
    mixed = run_all(engine_of(pair), [(PROMPTS[0], mine)] + crowd)[0]["tokens"]
    other_default = run_all(engine_of(pair, default=6), crowd[:2] + [(PROMPTS[0], mine)])[-1]["tokens"]
    assert len(alone) == 20 and alone == mixed == other_default
    control = run_all(engine_of(pair, batch=1), [(PROMPTS[0], SamplingParams(
        temperature=1.0, top_k=40, max_new_tokens=20, seed=3, num_draft_tokens=1))])[0]["tokens"]
    assert control != alone


@pytest.mark.parametrize("budget", [1, 2, 3, 6])
def test_a_row_never_drafts_past_its_budget_and_both_runners_count_alike(make_llama, budget):
    """Issue 35 item 9: greedy, γ = 4, the target drafting for itself (every draft accepted). max_new_tokens = 1
    used to report 4 drafted / 4 accepted / τ 5.0 on the engine and 0 / 0 / 1.0 on the loop."""
    target = make_llama(0)
    counts = {}
    for runner in ("fast", "hf"):
        result = specdec.generate(target, [[5, 6, 7]], drafter=target, num_draft_tokens=4, temperature=0,
                                  max_new_tokens=budget, engine=runner)
        stats = result.stats
        assert len(result.sequences[0]) == budget
        counts[runner] = (stats.drafted_tokens, stats.accepted_tokens, stats.mean_accepted_length)
    assert counts["fast"] == counts["hf"], counts
    drafted, left = 0, budget
    while left:  # a step drafts at most γ and what it can still commit (every draft is accepted here)
        step = min(4, left - 1)
        drafted, left = drafted + step, left - step - 1
    assert counts["fast"][:2] == (drafted, drafted)
    if budget == 1:
        assert counts["fast"] == (0, 0, 1.0)


def test_caps_are_checked_against_the_engine_before_anything_runs(pair):
    engine = engine_of(pair)
    with pytest.raises(ValueError, match="num_draft_tokens=9 exceeds the engine's max_draft_tokens of 8"):
        engine.add_request([1, 2], SamplingParams(num_draft_tokens=9))
    plain = engine_of(pair, default=0, drafter=False)
    for cap in (2, "auto"):
        with pytest.raises(ValueError, match="needs a drafter"):
            plain.add_request([1, 2], SamplingParams(num_draft_tokens=cap))
    plain.add_request([1, 2], SamplingParams(num_draft_tokens=0, max_new_tokens=2))  # (plain on a plain engine: fine)
    for bad, kind in ((-1, ValueError), (65, ValueError), ("often", ValueError), (2.0, TypeError), (True, TypeError)):
        with pytest.raises(kind, match="num_draft_tokens"):
            SamplingParams(num_draft_tokens=bad)
    with pytest.raises(ValueError, match="draft_tree needs speculative steps"):
        SamplingParams(draft_tree=[2, 1], num_draft_tokens=0)


def test_per_row_caps_build_no_step_shape_the_menu_does_not_have(pair):
    """After a warm-up of the "auto" menu (γ 0, 1, 2, 4, 8), caps 3, 5 and 7 run in the built shapes above them (the
    rows keep their own draft lengths): no new step shape, so no capture on CUDA."""
    engine = engine_of(pair, batch=4)
    engine.warmup(batch_sizes=(1, 2, 4), temperatures=(0.0,))
    built = engine.num_step_shapes
    requests = [(p, SamplingParams(temperature=0, max_new_tokens=12, num_draft_tokens=c))
                for p, c in zip(PROMPTS, [3, 5, 0, 7, 3, 0])]
    outs = run_all(engine, requests)
    assert engine.num_step_shapes == built
    assert all(max(o["drafted"]) <= c for o, (_, r) in zip(outs, requests) for c in [r.num_draft_tokens])
    assert max(outs[3]["drafted"]) == 7  # (a cap of 7 did draft 7: in the γ = 8 shape)
