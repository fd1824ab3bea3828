"""Token trees on the engine (per request, `SamplingParams.draft_tree`): greedy equality with transformers, a perfect
drafter accepted to full depth, [1]*γ drawing exactly what a chain draws, batch independence, the two-token law by
chi-square at T > 0 (top-k / top-p too) with negative controls, logprobs, statistics and refusals."""

import numpy as np
import pytest
import torch

import specdec
from helpers import RAGGED_PROMPTS, hf_greedy
from specdec.core import SamplingConfig
from specdec.engine import Engine, EngineConfig, tree_step
from specdec.request import SamplingParams
from stats_utils import chi2_pvalue
from test_distribution import PROMPT, exact_two_token_law

PASS, FAIL = 1e-3, 1e-8
ROWS = 6000


@pytest.fixture(scope="module")
def pair(make_llama):
    target, draft = make_llama(0), make_llama(1, layers=1)
    with torch.no_grad():  # peaked laws, so greedy drafts agree often enough to branch and descend
        target.lm_head.weight.mul_(8.0)
        draft.lm_head.weight.mul_(8.0)
    return target, draft


@pytest.fixture(scope="module")
def twin(make_llama):
    """The target's twin (same seed, same weights): a perfect drafter."""
    model = make_llama(0)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model


@pytest.fixture(scope="module")
def small_pair(make_llama):
    return make_llama(10, vocab=16), make_llama(11, layers=1, vocab=16)


def run(engine_pair, requests, **config):
    """Tokens (and outputs) per request of `requests` [(prompt, SamplingParams)], all added at once."""
    target, draft = engine_pair
    engine = Engine(target, draft, EngineConfig(**{"max_batch_size": 4, "max_seq_len": 128, **config}))
    ids = [engine.add_request(prompt, params) for prompt, params in requests]
    outs = {rid: [] for rid in ids}
    while engine.has_unfinished():
        for out in engine.step():
            outs[out.request_id].append(out)
    return [[t for o in outs[rid] for t in o.new_token_ids] for rid in ids], [outs[rid] for rid in ids], engine


@pytest.mark.parametrize("tree", [[2, 2, 1], [3, 1], [1, 1, 1, 1], [4]])
def test_greedy_equals_transformers_over_a_ragged_batch(pair, tree):
    target, draft = pair
    res = specdec.generate(target, RAGGED_PROMPTS, drafter=draft, draft_tree=tree, max_new_tokens=14, temperature=0,
                           eos_token_id=[], engine="fast")
    for prompt, seq in zip(RAGGED_PROMPTS, res.sequences):
        assert seq == hf_greedy(target, prompt, 14, [])
    assert res.stats.alpha is None  # trees report no single-draft β
    assert res.stats.accepted_tokens > 0


def test_a_perfect_drafter_is_accepted_to_full_depth(pair, twin):
    """The drafter is the target: every step commits D + 1 tokens, so the accepted path's K/V were put in place."""
    target, _ = pair
    res = specdec.generate(target, RAGGED_PROMPTS, drafter=twin, draft_tree=[2, 2, 1],
                           max_new_tokens=16, temperature=0, eos_token_id=[], engine="fast")
    for prompt, seq in zip(RAGGED_PROMPTS, res.sequences):
        assert seq == hf_greedy(target, prompt, 16, [])
    assert res.stats.mean_accepted_length == 4.0


def test_eos_and_budget_cut_a_tree_step(pair, twin):
    target, _ = pair
    eos = hf_greedy(target, RAGGED_PROMPTS[0], 6, [])[3]
    res = specdec.generate(target, RAGGED_PROMPTS, drafter=twin, draft_tree=[2, 2],
                           max_new_tokens=7, temperature=0, eos_token_id=[eos], engine="fast")
    for prompt, seq in zip(RAGGED_PROMPTS, res.sequences):
        assert seq == hf_greedy(target, prompt, 7, [eos])
    assert res.sequences[0][-1] == eos


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_a_one_child_tree_draws_what_a_chain_draws(pair, temperature):
    """Up to a row's last 3 tokens: there a chain row drafts only what its budget can still commit (a sampled token
    then comes from p, not from an accepted draft), while a tree step drafts its whole shape."""
    target, draft = pair
    kw = dict(drafter=draft, max_new_tokens=20, temperature=temperature, top_p=0.9, seed=4, eos_token_id=[],
              engine="fast")
    chain = specdec.generate(target, RAGGED_PROMPTS, num_draft_tokens=3, **kw)
    tree = specdec.generate(target, RAGGED_PROMPTS, draft_tree=[1, 1, 1], **kw)
    assert [s[:17] for s in tree.sequences] == [s[:17] for s in chain.sequences]
    if temperature == 0:  # (greedy: the same tokens whoever drafts them)
        assert tree.sequences == chain.sequences and tree.stats.accepted_tokens == chain.stats.accepted_tokens


def test_a_request_does_not_depend_on_its_batch(pair):
    me = SamplingParams(temperature=0.8, top_k=20, max_new_tokens=18, seed=7, draft_tree=(3, 2))
    alone, _, _ = run(pair, [(RAGGED_PROMPTS[0], me)])
    crowd = [(p, SamplingParams(temperature=t, max_new_tokens=9 + i, seed=i, draft_tree=(3, 2)))
             for i, (p, t) in enumerate(zip(RAGGED_PROMPTS[1:], (0.0, 1.0, 0.5)))]
    batched, _, _ = run(pair, [crowd[0], (RAGGED_PROMPTS[0], me), *crowd[1:]])
    assert batched[1] == alone[0]


def test_greedy_rows_among_sampled_ones_keep_their_tokens_and_branch(pair):
    target, draft = pair
    greedy = SamplingParams(temperature=0, max_new_tokens=14, draft_tree=(3, 1))
    crowd = [(p, SamplingParams(temperature=1.0, max_new_tokens=14, seed=i, draft_tree=(3, 1)))
             for i, p in enumerate(RAGGED_PROMPTS[1:])]
    tokens, outs, _ = run(pair, [(RAGGED_PROMPTS[0], greedy), *crowd])
    assert tokens[0] == hf_greedy(target, RAGGED_PROMPTS[0], 14, [])
    alone, alone_outs, _ = run(pair, [(RAGGED_PROMPTS[0], greedy)])
    assert [o.num_accepted for o in outs[0]] == [o.num_accepted for o in alone_outs[0]]


def test_logprobs_are_the_targets(pair):
    target, draft = pair
    params = SamplingParams(temperature=0, max_new_tokens=10, logprobs=True, top_logprobs=3, draft_tree=(2, 2))
    tokens, outs, _ = run(pair, [(RAGGED_PROMPTS[0], params)])
    logprobs = [lp for o in outs[0] for lp in o.logprobs]
    top = [alt for o in outs[0] for alt in o.top_logprobs]
    with torch.no_grad():
        full = torch.tensor([RAGGED_PROMPTS[0] + tokens[0]])
        ref = target(full).logits[0, len(RAGGED_PROMPTS[0]) - 1 : -1].log_softmax(-1)
    expected = ref.gather(-1, torch.tensor(tokens[0])[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor(logprobs), expected, atol=1e-4, rtol=0)
    assert [[t for t, _ in alt] for alt in top] == ref.topk(3, dim=-1).indices.tolist()
    assert sum(o.num_drafted for o in outs[0]) > 0  # (tree steps ran: 2 + 4 nodes each)


def test_requests_of_other_shapes_wait_their_turn(pair):
    """One step runs one tree shape (or chains): later requests of another shape wait until the running ones end."""
    target, _ = pair
    shapes = [(2, 1), None, (2, 1), (3,), None]
    requests = [(p, SamplingParams(temperature=0, max_new_tokens=8, draft_tree=s))
                for p, s in zip(RAGGED_PROMPTS + [[2, 3]], shapes)]
    tokens, _, engine = run(pair, requests, num_draft_tokens=2)
    for (prompt, _), seq in zip(requests, tokens):
        assert seq == hf_greedy(target, prompt, 8, [])
    assert engine.stats.alpha is not None and engine.stats.accepted_tokens > 0


@pytest.mark.parametrize("tree, sampling", [([2, 2], SamplingConfig(1.0)), ([3, 1], SamplingConfig(0.8, top_k=6)),
                                            ([2, 2], SamplingConfig(1.2, top_p=0.8))])
def test_two_token_law(small_pair, tree, sampling):
    target, draft = small_pair
    res = specdec.generate(target, [PROMPT] * ROWS, drafter=draft, draft_tree=tree, max_new_tokens=2,
                           temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p, seed=1,
                           eos_token_id=[], engine="fast")
    pairs = np.array([s[0] * 16 + s[1] for s in res.sequences])
    assert chi2_pvalue(pairs, exact_two_token_law(target, sampling)) > PASS
    assert res.stats.accepted_tokens > 0


@pytest.fixture(scope="module")
def sharp_pair(make_llama):
    """A flat target and a peaked drafter: the without-replacement correction matters (its q drops by half)."""
    target, draft = make_llama(10, vocab=16), make_llama(11, layers=1, vocab=16)
    with torch.no_grad():
        draft.lm_head.weight.mul_(24.0)
    return target, draft


def first_token_pvalue(pair, tree) -> float:
    """Chi-square p-value of the first token of ROWS requests against the target's law at the prompt."""
    target, draft = pair
    res = specdec.generate(target, [PROMPT] * ROWS, drafter=draft, draft_tree=tree, max_new_tokens=1,
                           temperature=1.0, seed=2, eos_token_id=[], engine="fast")
    with torch.no_grad():
        law = target(torch.tensor([PROMPT])).logits[0, -1].softmax(-1).double().numpy()
    return chi2_pvalue(np.array([s[0] for s in res.sequences]), law)


def test_first_token_law_with_a_peaked_drafter(sharp_pair):
    assert first_token_pvalue(sharp_pair, [4]) > PASS


def test_negative_control_children_verified_as_iid_fail(sharp_pair, monkeypatch):
    """Children drawn without replacement but verified as i.i.d. (no removal from q) break the law."""
    real = tree_step.walk_tree
    monkeypatch.setattr(tree_step, "walk_tree", lambda *a, **k: real(*a, **k, mode="iid"))
    assert first_token_pvalue(sharp_pair, [4]) < FAIL


def test_negative_control_without_the_path_copy_greedy_breaks(pair, twin, monkeypatch):
    """Leaving the accepted nodes' K/V where the tree put them (no copy into chain order) changes the tokens."""
    monkeypatch.setattr(tree_step, "commit_path", lambda *args: None)  # (static)
    monkeypatch.setattr(tree_step.PagedSlotCache, "copy_positions", lambda *args: None)  # (paged, the default)
    target, _ = pair
    res = specdec.generate(target, RAGGED_PROMPTS, drafter=twin, draft_tree=[3, 2], max_new_tokens=16,
                           temperature=0, eos_token_id=[], engine="fast")
    assert any(seq != hf_greedy(target, p, 16, []) for p, seq in zip(RAGGED_PROMPTS, res.sequences))


def test_refusals_name_the_problem(pair, make_llama):
    target, draft = pair
    engine = Engine(target, draft, EngineConfig(max_batch_size=2, max_seq_len=64, max_draft_tokens=3,
                                                max_tree_nodes=8))
    for params, match in ((SamplingParams(draft_tree=(2, 2, 2)), "max_tree_nodes"),
                          (SamplingParams(draft_tree=(1, 1, 1, 1)), "max_draft_tokens"),
                          (SamplingParams(draft_tree=(2,), leniency=0.5), "leniency")):
        with pytest.raises(ValueError, match=match):
            engine.add_request([1, 2], params)
    with pytest.raises(ValueError, match="draft model"):
        Engine(target, specdec.PromptLookupDrafter(), EngineConfig(max_seq_len=64)).add_request(
            [1, 2], SamplingParams(draft_tree=(2,)))
    with pytest.raises(ValueError, match="draft_tree"):
        SamplingParams(draft_tree=(2, 0))
    with pytest.raises(ValueError, match="max_tree_nodes"):
        EngineConfig(max_tree_nodes=65)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_trees_under_cuda_graphs(make_llama):
    """Captured tree steps (fused layers, the Triton tree mask): greedy equality with transformers, a perfect drafter
    at full depth, seeded sampling repeating and equal to the eager CPU engine's draws, one capture per shape."""
    target, draft, twin = make_llama(0), make_llama(1, layers=1), make_llama(0)
    with torch.no_grad():
        for model in (target, draft, twin):
            model.lm_head.weight.mul_(8.0)
    kw = dict(max_new_tokens=24, temperature=0.8, top_p=0.9, seed=5, eos_token_id=[], engine="fast",
              draft_tree=[3, 2, 1])
    cpu = specdec.generate(target, RAGGED_PROMPTS, drafter=draft, **kw).sequences
    target, draft, twin = target.cuda(), draft.cuda(), twin.cuda()
    runs = [specdec.generate(target, RAGGED_PROMPTS, drafter=draft, **kw).sequences for _ in range(2)]
    assert runs[0] == runs[1]
    assert sum(a == b for a, b in zip(runs[0], cpu)) >= 3  # the same counters (round-off may flip a rare token)
    for drafter, tree in ((draft, [2, 2, 1]), (twin, [2, 2, 1]), (draft, [4])):
        res = specdec.generate(target, RAGGED_PROMPTS, drafter=drafter, max_new_tokens=20, temperature=0,
                               eos_token_id=[], engine="fast", draft_tree=tree)
        for prompt, seq in zip(RAGGED_PROMPTS, res.sequences):
            assert seq == hf_greedy(target, prompt, 20, [])
        if drafter is twin:
            assert res.stats.mean_accepted_length == 4.0
    engine = Engine(target, draft, EngineConfig(max_batch_size=4, max_seq_len=256))
    assert engine.cuda_graphs
    for length in (3, 9, 17, 5):
        engine.add_request(list(range(1, length + 1)), SamplingParams(temperature=0, max_new_tokens=20,
                                                                      draft_tree=(2, 2)))
        while engine.has_unfinished():
            engine.step()
    shapes = len(engine._steps)
    for length in (4, 8, 16):
        engine.add_request(list(range(1, length + 1)), SamplingParams(temperature=0, max_new_tokens=20,
                                                                      draft_tree=(2, 2)))
        while engine.has_unfinished():
            engine.step()
    assert len(engine._steps) == shapes


def test_warmup_builds_the_tree_steps_requests_will_run(pair):
    target, draft = pair
    engine = Engine(target, draft, EngineConfig(max_batch_size=2, max_seq_len=128, num_draft_tokens=2))
    built = engine.warmup(batch_sizes=(1, 2), gammas=[2], max_length=64, draft_trees=[(2, 2), [3, 1]])
    decode = len(engine._steps)  # (beside them: the mixed steps of those batch sizes and γ, no trees among them)
    assert built == decode + len(engine.runner.mixed_steps) and len(engine.runner.mixed_steps) > 0
    assert sum(isinstance(k[1], tuple) for k in engine._steps) == decode * 2 // 3
    shapes, mixed = len(engine._steps), len(engine.runner.mixed_steps)
    for prompt in RAGGED_PROMPTS[:2]:
        engine.add_request(prompt, SamplingParams(temperature=0, max_new_tokens=20, draft_tree=(2, 2)))
    while engine.has_unfinished():
        engine.step()
    assert (len(engine._steps), len(engine.runner.mixed_steps)) == (shapes, mixed)  # nothing new to build
    with pytest.raises(ValueError, match="draft_tree"):
        engine.warmup(draft_trees=[(0,)])
