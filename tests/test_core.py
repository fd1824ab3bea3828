"""Hand-built cases for the pure functions in specdec.core."""

import pytest
import torch

from specdec.core import SamplingConfig, acceptance_beta, sample, standardize_logits, verify, verify_greedy


def onehot(i, v=4):
    out = torch.zeros(v)
    out[i] = 1.0
    return out


def test_accept_all_then_bonus_from_last_position():
    p = torch.tensor([[[0.5, 0.5, 0, 0], [0.1, 0.6, 0.3, 0], [0, 0, 0, 1.0]]])  # [1, 3, 4]
    q = torch.tensor([[[0.5, 0.5, 0, 0], [0.1, 0.6, 0.3, 0]]])
    drafts = torch.tensor([[1, 2]])
    res = verify(drafts, q, p, uniforms=torch.tensor([[0.99, 0.99]]))  # p == q: always accepted
    assert res.num_accepted.tolist() == [2]
    assert res.next_token.tolist() == [3]  # the bonus comes from p_3, which is one-hot at 3
    assert res.tokens(drafts).tolist() == [[1, 2, 3]]


def test_reject_first_samples_from_residual():
    p = torch.tensor([[[0.2, 0.8, 0, 0], [0.25, 0.25, 0.25, 0.25]]])
    q = torch.tensor([[[1.0, 0, 0, 0]]])  # drafter is sure of token 0
    # accept 0 with p/q = 0.2: r = 0.5 rejects; the residual max(0, p - q) is one-hot at token 1
    res = verify(torch.tensor([[0]]), q, p, uniforms=torch.tensor([[0.5]]))
    assert res.num_accepted.tolist() == [0]
    assert res.next_token.tolist() == [1]
    res = verify(torch.tensor([[0]]), q, p, uniforms=torch.tensor([[0.1]]))
    assert res.num_accepted.tolist() == [1]


def test_reject_in_the_middle_discards_later_drafts():
    v = 4
    p = torch.stack([onehot(1), onehot(2), onehot(3), onehot(0)])[None]  # [1, 4, 4]
    q = torch.stack([onehot(1), onehot(0), onehot(3)])[None]
    res = verify(torch.tensor([[1, 0, 3]]), q, p, uniforms=torch.zeros(1, 3))
    assert res.num_accepted.tolist() == [1]  # x_2 = 0 has p = 0: rejected even with r = 0
    assert res.next_token.tolist() == [2]  # residual at position 2 is one-hot at 2
    assert res.tokens(torch.tensor([[1, 0, 3]]))[0, :2].tolist() == [1, 2]
    assert v == p.shape[-1]


def test_zero_probability_token_is_never_accepted():
    p = torch.tensor([[[0.0, 1.0], [0.5, 0.5]]])
    q = torch.tensor([[[1.0, 0.0]]])
    res = verify(torch.tensor([[0]]), q, p, uniforms=torch.zeros(1, 1))
    assert res.num_accepted.tolist() == [0] and res.next_token.tolist() == [1]


def test_deterministic_drafts_accept_with_probability_p():
    p = torch.tensor([[[0.3, 0.7], [1.0, 0.0]], [[0.3, 0.7], [1.0, 0.0]]])
    drafts = torch.tensor([[1], [0]])
    res = verify(drafts, None, p, uniforms=torch.tensor([[0.69], [0.31]]))
    assert res.num_accepted.tolist() == [1, 0]
    assert res.next_token.tolist() == [0, 1]  # row 1: residual of one-hot q at 0 is one-hot at 1
    assert torch.allclose(res.beta, torch.tensor([[0.7], [0.3]]))


def test_rows_accept_their_own_counts_and_draft_lengths():
    p = torch.stack([onehot(1), onehot(1), onehot(1)])[None].repeat(3, 1, 1)
    drafts = torch.tensor([[1, 1], [2, 1], [1, 1]])
    res = verify(drafts, None, p, draft_lengths=torch.tensor([2, 2, 1]), uniforms=torch.zeros(3, 2))
    assert res.num_accepted.tolist() == [2, 0, 1]
    # row 2 drafted only one token: its next token comes from p at position 2 (not a residual)
    assert res.next_token.tolist() == [1, 1, 1]


def test_plain_sampling_is_gamma_zero():
    p = torch.tensor([[[0.0, 0.0, 1.0, 0.0]]])
    res = verify(torch.zeros(1, 0, dtype=torch.long), None, p, torch.Generator().manual_seed(0))
    assert res.num_accepted.tolist() == [0] and res.next_token.tolist() == [2]


def test_verify_rejects_wrong_shapes():
    with pytest.raises(ValueError, match="target_probs"):
        verify(torch.zeros(1, 2, dtype=torch.long), None, torch.ones(1, 2, 4) / 4)


def test_greedy_path_matches_argmax():
    logits = torch.tensor([[[0.0, 5.0, 1.0], [3.0, 0.0, 1.0], [0.0, 0.0, 9.0]]])
    res = verify_greedy(torch.tensor([[1, 2]]), logits)
    assert res.num_accepted.tolist() == [1] and res.next_token.tolist() == [0]
    assert res.beta.tolist() == [[1.0, 0.0]]
    res = verify_greedy(torch.tensor([[1, 0]]), logits)
    assert res.num_accepted.tolist() == [2] and res.next_token.tolist() == [2]


def test_beta_is_one_minus_total_variation():
    p = torch.tensor([[[0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]]])
    q = torch.tensor([[[0.25, 0.25, 0.5]]])
    beta = acceptance_beta(p, q, torch.tensor([[0]]))
    tv = 0.5 * (p[0, 0] - q[0, 0]).abs().sum()
    assert beta.item() == pytest.approx(1 - tv.item())


def test_sample_follows_probs_and_never_picks_zero():
    g = torch.Generator().manual_seed(0)
    probs = torch.tensor([0.1, 0.0, 0.6, 0.3]).expand(100_000, -1)
    counts = torch.bincount(sample(probs, g), minlength=4).float() / 100_000
    assert counts[1] == 0
    assert torch.allclose(counts, torch.tensor([0.1, 0.0, 0.6, 0.3]), atol=0.01)


class TestStandardize:
    def test_greedy_is_one_hot(self):
        probs = standardize_logits(torch.tensor([[1.0, 3.0, 2.0]]), SamplingConfig(temperature=0))
        assert probs.tolist() == [[0.0, 1.0, 0.0]]

    def test_matches_transformers_warpers(self):
        from transformers.generation.logits_process import (
            TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper,
        )

        torch.manual_seed(0)
        logits = torch.randn(6, 50) * 3
        for t, k, p in [(0.7, 0, 1.0), (1.0, 5, 1.0), (1.3, 0, 0.8), (0.5, 10, 0.9), (1.0, 1, 0.5), (2.0, 0, 0.05)]:
            ref = logits.clone()
            for warper in [TemperatureLogitsWarper(t)] + ([TopKLogitsWarper(k)] if k else []) + (
                [TopPLogitsWarper(p)] if p < 1 else []
            ):
                ref = warper(None, ref)
            ours = standardize_logits(logits, SamplingConfig(temperature=t, top_k=k, top_p=p))
            assert torch.allclose(ours, ref.softmax(-1), atol=1e-6), (t, k, p)

    def test_top_p_keeps_smallest_prefix_reaching_p(self):
        logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
        probs = standardize_logits(logits, SamplingConfig(top_p=0.8))
        assert torch.allclose(probs, torch.tensor([0.625, 0.375, 0.0, 0.0]))

    @pytest.mark.parametrize(
        "kwargs, match",
        [
            ({"temperature": -0.1}, "temperature"),
            ({"temperature": float("nan")}, "temperature"),
            ({"top_p": 0.0}, "top_p"),
            ({"top_p": 1.5}, "top_p"),
            ({"top_k": -1}, "top_k"),
        ],
    )
    def test_bad_config(self, kwargs, match):
        with pytest.raises(ValueError, match=match):
            SamplingConfig(**kwargs)

    def test_nan_logits_raise(self):
        with pytest.raises(ValueError, match="NaN"):
            standardize_logits(torch.tensor([0.0, float("nan")]), SamplingConfig())


class TestTopPBoundaryAsTransformers:
    """top-p keeps the smallest prefix whose mass reaches top_p, with the boundary (and ties on it) decided
    exactly as transformers' TopPLogitsWarper decides it."""

    @staticmethod
    def reference(logits, t=1.0, k=0, p=1.0):
        from transformers.generation.logits_process import (
            TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper,
        )

        ref = logits.clone()
        for warper in ([TemperatureLogitsWarper(t)] if t != 1.0 else []) + ([TopKLogitsWarper(k)] if k else []) + (
            [TopPLogitsWarper(p)] if p < 1 else []
        ):
            ref = warper(None, ref)
        return ref.softmax(-1)

    def test_leading_mass_equal_to_top_p(self):
        # the case: 0.5 + 0.3 = 0.8 exactly reaches top_p, so two tokens survive (transformers keeps two)
        logits = torch.tensor([[0.3, 0.1, 0.1, 0.5]]).log()
        probs = standardize_logits(logits, SamplingConfig(top_p=0.8))
        assert (probs > 0).tolist() == [[True, False, False, True]]
        assert torch.equal(probs, self.reference(logits, p=0.8))

    def test_ties_and_boundaries_match_transformers(self):
        gen = torch.Generator().manual_seed(0)
        cases = [torch.tensor([[0.25, 0.25, 0.25, 0.25]]).log(), torch.tensor([[0.4, 0.2, 0.2, 0.1, 0.1]]).log(),
                 torch.tensor([[0.5, 0.25, 0.125, 0.125]]).log(), torch.randint(0, 3, (64, 12), generator=gen).float(),
                 torch.randn(64, 30, generator=gen)]
        top_ps = [0.1, 0.25, 0.5, 0.6, 0.75, 0.8, 0.875, 0.9, 0.95, 0.99]
        for logits in cases:
            for p in top_ps:
                for t, k in ((1.0, 0), (0.7, 0), (1.0, 3)):
                    ours = standardize_logits(logits, SamplingConfig(temperature=t, top_k=k, top_p=p))
                    ref = self.reference(logits, t, k, p)
                    assert torch.equal(ours > 0, ref > 0), (logits[0], p, t, k)
                    assert torch.allclose(ours, ref, atol=1e-6)


class TestNonFiniteScores:
    def test_plus_inf_nan_and_all_minus_inf_are_errors(self):
        inf = float("inf")
        for row in ([0.0, inf, 1.0], [0.0, float("nan"), 1.0], [-inf, -inf, -inf]):
            for t in (0.0, 1.0):
                with pytest.raises(ValueError, match=r"NaN or \+inf"):
                    standardize_logits(torch.tensor([row]), SamplingConfig(temperature=t))
            with pytest.raises(ValueError, match="target logits"):
                verify_greedy(torch.zeros(1, 0, dtype=torch.long), torch.tensor([[row]]))

    def test_minus_inf_entries_are_masked_tokens(self):
        probs = standardize_logits(torch.tensor([[-float("inf"), 0.0, 0.0]]), SamplingConfig(top_p=0.9))
        assert probs.tolist() == [[0.0, 0.5, 0.5]]

    def test_unchecked_plus_inf_is_the_softmax_limit_not_nan(self):
        # inside a CUDA graph the check is skipped: the law must still be a distribution (no NaN → token 0)
        probs = standardize_logits(torch.tensor([[1.0, float("inf"), 2.0, float("inf")]]), SamplingConfig(),
                                   check_nan=False)
        assert probs.tolist() == [[0.0, 0.5, 0.0, 0.5]]

    def test_tiny_temperature_does_not_overflow(self):
        # 1e34 / 2e-5 overflows float32 (both top logits become +inf, softmax NaN); the max-shifted logits give
        # the same law without ±inf
        logits = torch.tensor([[1e34, 2e34, -3e34]])
        probs = standardize_logits(logits, SamplingConfig(temperature=2e-5))
        assert probs.tolist() == [[0.0, 1.0, 0.0]]
        moderate = torch.tensor([[0.0, 1e-4, 5.0]])
        assert torch.allclose(standardize_logits(moderate, SamplingConfig(temperature=2e-5)),
                              torch.tensor([[0.0, 0.0, 1.0]]))

    def test_temperature_floor_is_greedy(self):
        from specdec.core import TEMPERATURE_FLOOR

        assert SamplingConfig(temperature=1e-38).greedy and SamplingConfig(temperature=TEMPERATURE_FLOOR / 2).greedy
        assert not SamplingConfig(temperature=TEMPERATURE_FLOOR).greedy
        probs = standardize_logits(torch.tensor([[3.0, 1.0, 7.0]]), SamplingConfig(temperature=1e-38))
        assert probs.tolist() == [[0.0, 0.0, 1.0]]


class TestDraftSlotsPastTheirLength:
    """`verify` never reads a row's slots past draft_lengths: vLLM-style -1 padding (or any value) is fine."""

    def test_minus_one_padding_equals_zero_padding(self):
        gen = torch.Generator().manual_seed(3)
        p = torch.rand(3, 4, 7, generator=gen)
        p = p / p.sum(-1, keepdim=True)
        q = torch.rand(3, 3, 7, generator=gen)
        q = q / q.sum(-1, keepdim=True)
        lengths = torch.tensor([3, 1, 0])
        drafts = torch.tensor([[1, 2, 3], [4, -1, -1], [-1, -1, -1]])
        zero_padded = drafts.clamp_min(0)
        u, noise = torch.rand(3, 3, generator=gen), torch.empty(3, 7).exponential_(generator=gen)
        for probs in (None, q):
            a = verify(drafts, probs, p, draft_lengths=lengths, uniforms=u, noise=noise)
            b = verify(zero_padded, probs, p, draft_lengths=lengths, uniforms=u, noise=noise)
            assert torch.equal(a.num_accepted, b.num_accepted) and torch.equal(a.next_token, b.next_token)
            assert torch.equal(a.beta, b.beta) and a.beta[1, 1:].tolist() == [0.0, 0.0]
        q_garbage = q.clone()
        q_garbage[1, 1:] = float("nan")  # slots past a row's length may hold anything
        q_garbage[2] = float("nan")
        a = verify(drafts, q_garbage, p, draft_lengths=lengths, uniforms=u, noise=noise)
        b = verify(zero_padded, q, p, draft_lengths=lengths, uniforms=u, noise=noise)
        assert torch.equal(a.num_accepted, b.num_accepted) and torch.equal(a.next_token, b.next_token)
        assert torch.equal(a.beta, b.beta) and not a.beta.isnan().any()
        g = verify_greedy(drafts, p.log(), draft_lengths=lengths)
        assert torch.equal(g.num_accepted, verify_greedy(zero_padded, p.log(), draft_lengths=lengths).num_accepted)

    def test_out_of_vocabulary_draft_is_rejected_and_residual_is_p(self):
        p = torch.tensor([[[0.2, 0.8], [0.5, 0.5]]])
        res = verify(torch.tensor([[9]]), None, p, uniforms=torch.zeros(1, 1), noise=torch.ones(1, 2))
        assert res.num_accepted.tolist() == [0] and res.next_token.tolist() == [1]  # argmax of p/1
        assert res.beta.tolist() == [[0.0]]


def test_verify_coupled_accepts_while_drafts_equal_the_target_draws():
    from specdec.core import verify_coupled

    drafts = torch.tensor([[4, 5, 6], [4, 5, 6], [4, 5, 6], [4, 5, 6]])
    draws = torch.tensor([[4, 5, 6, 7], [9, 5, 6, 7], [4, 5, 8, 7], [4, 5, 6, 7]])
    result = verify_coupled(drafts, draws, draft_lengths=torch.tensor([3, 3, 3, 1]))
    assert result.num_accepted.tolist() == [3, 0, 2, 1]  # all, reject first, reject mid, a short row
    assert result.next_token.tolist() == [7, 9, 8, 5]  # the target's own draw where the row stops
    assert result.tokens(drafts)[0].tolist() == [4, 5, 6, 7]
    assert result.beta.tolist() == [[1, 1, 1], [0, 1, 1], [1, 1, 0], [1, 0, 0]]
    with pytest.raises(ValueError, match="target_tokens"):
        verify_coupled(drafts, draws[:, :3])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_top_p_law_of_a_row_does_not_depend_on_its_batch_on_cuda():
    """CUDA scans a single-row tensor with another kernel than a batch of rows; top-p's cumsum takes one algorithm
    for both, so a row's standardized law is the same bits alone (a plain step at batch 1) and in a batch."""
    from specdec.core import standardize_rows

    logits = torch.randn(64, 1, 32000, device="cuda", generator=torch.Generator("cuda").manual_seed(0)) * 3
    temperature = torch.full((64,), 0.9, device="cuda")
    top_p = torch.full((64,), 0.9, device="cuda")
    batch = standardize_rows(logits, temperature, {"top_p": top_p})
    for row in (0, 17, 63):
        alone = standardize_rows(logits[row : row + 1], temperature[:1], {"top_p": top_p[:1]})
        assert torch.equal(alone[0], batch[row])


def test_invalid_scores_is_the_three_pass_definition():
    """`invalid_scores` (one amax pass) = NaN anywhere | +inf anywhere | a row of only -inf, on crafted rows."""
    from specdec.core import invalid_scores

    nan, inf = float("nan"), float("inf")

    def literal(x):
        return bool(torch.isnan(x).any() | (x == inf).any() | (x == -inf).all(-1).any())

    rows = [[0.0, 1.0, 2.0], [0.0, nan, 2.0], [nan, nan, nan], [inf, 0.0, 1.0], [-inf, -inf, -inf], [-inf, 0.0, -inf],
            [-inf, inf, nan], [-0.0, 0.0, -1e38]]
    for a in rows:
        for b in rows:
            x = torch.tensor([a, b])
            assert bool(invalid_scores(x)) == literal(x), (a, b)
            assert bool(invalid_scores(x[None])) == literal(x)  # [1, 2, V]
    for empty in (torch.zeros(0, 3), torch.zeros(2, 0), torch.zeros(0, 0)):
        assert bool(invalid_scores(empty)) == literal(empty)
