"""FastTarget / FastDrafter / fast_generate give the target's own greedy output and the exact sampling law."""


import pytest
import torch

import specdec
from helpers import RAGGED_PROMPTS, assert_same_greedy, hf_greedy
from specdec.core import SamplingConfig, sample, standardize_logits
from specdec.fast import FastDrafter, FastTarget


def fast_generate(*args, **kwargs):
    """The request-level engine (the wave-1 fused engine's successor) on the same arguments."""
    return specdec.generate(*args, engine="fast", **kwargs)


MAX_NEW = 20


def _fresh_copy(model):
    """The same weights in a new module (not a deepcopy: earlier tests may cache engines, holding locks, on the
    session's `llama`)."""
    with torch.random.fork_rng(devices=[]):  # (its throwaway initialization leaves the global RNG as it was)
        fresh = type(model)(model.config).eval()
    fresh.load_state_dict(model.state_dict())
    return fresh


@pytest.fixture(scope="module")
def near_copy(llama):
    """A drafter close to the target (high α): exercises accept-all steps and partial rejections."""
    model = _fresh_copy(llama)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(5)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.02)
    return model


def _drafters(kind, llama, llama_draft, near_copy):
    corpus = [[(i * 7 + j) % 64 for i in range(100)] for j in range(3)]
    return {
        "none": None,
        "fast_small": FastDrafter(llama_draft),
        "fast_near": FastDrafter(near_copy),
        "fast_self": FastDrafter(llama),
        "bigram": specdec.NGramDrafter(2).fit(corpus, 64),
        "prompt_lookup": specdec.PromptLookupDrafter(),
    }[kind]


KINDS = ["none", "fast_small", "fast_near", "fast_self", "bigram", "prompt_lookup"]


@pytest.mark.parametrize("engine", ["loop", "fused"])
@pytest.mark.parametrize("gamma", [1, 4])
@pytest.mark.parametrize("kind", KINDS)
def test_greedy_equals_hf(llama, llama_draft, near_copy, kind, gamma, engine):
    eos = [2]
    refs = [hf_greedy(llama, p, MAX_NEW, eos) for p in RAGGED_PROMPTS]
    target = FastTarget(llama)
    drafter = _drafters(kind, llama, llama_draft, near_copy)
    run = specdec.generate if engine == "loop" else fast_generate
    res = run(target, RAGGED_PROMPTS, drafter=drafter, temperature=0, max_new_tokens=MAX_NEW,
              num_draft_tokens=gamma, eos_token_id=eos)
    for prompt, ours, ref in zip(RAGGED_PROMPTS, res.sequences, refs):
        assert_same_greedy(llama, prompt, ours, ref)
    if kind == "fast_self":
        assert res.stats.alpha == 1.0
    assert res.stats.num_generated_tokens == sum(len(s) for s in res.sequences)


def test_fast_drafter_matches_hf_model_drafter(llama, near_copy):
    """Same greedy drafts and the same acceptance as the HF ModelDrafter in the ordinary loop."""
    kw = dict(temperature=0, max_new_tokens=MAX_NEW, num_draft_tokens=3, eos_token_id=[])
    ref = specdec.generate(llama, RAGGED_PROMPTS, drafter=near_copy, **kw)
    ours = specdec.generate(FastTarget(llama), RAGGED_PROMPTS, drafter=FastDrafter(near_copy), **kw)
    assert ours.sequences == ref.sequences
    assert ours.stats.accepted_by_position == ref.stats.accepted_by_position
    assert ours.stats.alpha == pytest.approx(ref.stats.alpha)


def test_engine_reuses_its_graph_state_across_requests(llama, near_copy):
    target, drafter = FastTarget(llama), FastDrafter(near_copy)
    kw = dict(temperature=0, max_new_tokens=12, num_draft_tokens=3, eos_token_id=[])
    first = fast_generate(target, RAGGED_PROMPTS, drafter=drafter, **kw)
    again = fast_generate(target, RAGGED_PROMPTS, drafter=drafter, **kw)
    other = fast_generate(target, RAGGED_PROMPTS[:2], drafter=drafter, **kw)
    assert first.sequences == again.sequences
    assert other.sequences == first.sequences[:2]


def test_cache_is_sized_to_the_request(llama):
    target = FastTarget(llama, max_draft_tokens=5)
    target.begin([[1, 2, 3], [4]], max_new_tokens=10)
    assert target.cache.num_slots >= 3 + 10 + 5
    assert target.cache.num_slots < 3 + 10 + 5 + 16
    assert target.lengths.tolist() == [2, 0]  # all but each prompt's last token


def test_crop_and_select_rows(llama):
    target = FastTarget(llama)
    target.begin([[1, 2, 3, 4], [5, 6]], max_new_tokens=8)
    target.forward(torch.tensor([[4, 9], [6, 9]]))
    target.crop(torch.tensor([4, 2]))
    with pytest.raises(ValueError, match="shorten"):
        target.crop(torch.tensor([9, 2]))
    target.select_rows(torch.tensor([1]))
    out = target.forward(torch.tensor([[7]]))
    ref = llama(torch.tensor([[5, 6, 7]])).logits[0, -1]
    torch.testing.assert_close(out[0, 0], ref, atol=1e-4, rtol=0)


def test_fast_drafter_reports_the_q_it_sampled_from(llama_draft):
    drafter = FastDrafter(llama_draft)
    target = FastTarget(llama_draft)
    context = target.begin([[1, 2, 3, 4], [5]], max_new_tokens=8)
    drafter.begin(context, 64)
    sampling = SamplingConfig(temperature=0.8, top_k=20)
    gen = torch.Generator().manual_seed(3)
    state = gen.get_state()
    proposal = drafter.propose(context, 3, sampling, gen)
    gen.set_state(state)
    noise = torch.empty(2, 3, 64).exponential_(generator=gen)
    for b, prefix in enumerate([[1, 2, 3, 4], [5]]):
        seq = list(prefix)
        for i in range(3):
            with torch.no_grad():
                q = standardize_logits(llama_draft(torch.tensor([seq])).logits[0, -1], sampling)
            torch.testing.assert_close(proposal.probs[b, i], q, atol=1e-5, rtol=0)
            assert int(proposal.tokens[b, i]) == int(sample(q, noise=noise[b, i]))
            seq.append(int(proposal.tokens[b, i]))


def _exact_two_token_law(model, prompt, sampling):
    """P(x1, x2 | prompt) of the standardized target, by enumeration (small vocabulary)."""
    with torch.no_grad():
        p1 = standardize_logits(model(torch.tensor([prompt])).logits[0, -1], sampling)
        vocab = p1.shape[0]
        seqs = torch.tensor([prompt + [x] for x in range(vocab)])
        p2 = standardize_logits(model(seqs).logits[:, -1], sampling)
    return p1[:, None] * p2  # [V, V]


class _Wrapped(specdec.Drafter):
    """A FastDrafter behind the generic Drafter protocol (the engine then drafts eagerly); may lie about q."""

    def __init__(self, inner, lie: bool):
        self.inner, self.lie, self.vocab_size = inner, lie, inner.vocab_size

    def begin(self, context, vocab_size):
        self.inner.begin(context, vocab_size)

    def propose(self, *args, **kwargs):
        proposal = self.inner.propose(*args, **kwargs)
        if not self.lie:
            return proposal
        return specdec.Proposal(tokens=proposal.tokens, probs=torch.full_like(proposal.probs, 1 / 8),
                                forward_passes=proposal.forward_passes)


@pytest.mark.parametrize("kind", ["fast", "wrapped", "lying"])
def test_sampling_law_is_the_targets(make_llama, kind):
    """Joint law of the first two tokens (fused engine, model drafter, γ=2) vs the exact target law.

    Covers the first token, the token after a rejection (residual) and the bonus token, for the in-graph
    FastDrafter path and the eager generic-drafter path. Negative control: a drafter that reports the wrong
    q (uniform) must fail the same test.
    """
    target_model = make_llama(11, layers=2, vocab=8)
    draft_model = make_llama(12, layers=1, vocab=8)
    sampling = SamplingConfig(temperature=1.0)
    prompt = [1, 2, 3]
    rows = 6000
    drafter = FastDrafter(draft_model)
    if kind != "fast":
        drafter = _Wrapped(drafter, lie=kind == "lying")
    run = fast_generate if kind == "fast" else specdec.generate  # the engine runs only drafters it knows
    res = run(FastTarget(target_model), [prompt] * rows, drafter=drafter, temperature=1.0,
              max_new_tokens=2, num_draft_tokens=2, eos_token_id=[], seed=0)
    counts = torch.zeros(8, 8)
    for seq in res.sequences:
        counts[seq[0], seq[1]] += 1
    expected = _exact_two_token_law(target_model, prompt, sampling) * rows
    keep = expected > 5
    chi2 = float((((counts - expected) ** 2) / expected)[keep].sum())
    dof = int(keep.sum()) - 1
    from scipy.stats import chi2 as chi2_dist

    p_value = chi2_dist.sf(chi2, dof)
    if kind == "lying":
        assert p_value < 1e-6, f"the negative control passed (p={p_value})"
    else:
        assert p_value > 1e-3, f"chi2={chi2:.1f} dof={dof} p={p_value}"
        assert expected[~keep].sum() < 0.01 * rows


def test_nan_logits_raise_once_per_step(llama):
    """The engine checks NaN on the device and raises after the step's one host transfer."""
    target = FastTarget(_fresh_copy(llama))
    with torch.no_grad():
        target.model.final_norm.fill_(float("nan"))
    with pytest.raises(ValueError, match="NaN"):
        fast_generate(target, [[1, 2, 3]], max_new_tokens=4, temperature=0, eos_token_id=[])


def test_crop_lengths_moves_the_pointer_and_refuses_to_lengthen():
    from specdec.fast.target import crop_lengths

    lengths = torch.tensor([5, 7])
    crop_lengths(lengths, torch.tensor([3, 7]))
    assert lengths.tolist() == [3, 7]
    crop_lengths(lengths, 2)
    assert lengths.tolist() == [2, 2]
    for bad in (torch.tensor([3, 2]), torch.tensor([-1, 0])):
        with pytest.raises(ValueError, match="crop can only shorten"):
            crop_lengths(lengths, bad)
    assert lengths.tolist() == [2, 2]
