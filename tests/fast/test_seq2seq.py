"""The fast encoder-decoder path (FastT5, FastSeq2SeqTarget/Drafter): transformers' logits through calls
and rollbacks, transformers' greedy output, the exact sampling law, refusal of what it does not cover."""

from __future__ import annotations

import copy
import random
from functools import partial

import pytest
import torch

import seq2seq_models
import specdec
from seq2seq_models import teacher_forced_logits
from specdec.drafters.base import Drafter, Proposal
from specdec.fast.seq2seq import FastSeq2SeqDrafter, FastSeq2SeqState, FastSeq2SeqTarget, covers_seq2seq, source_width
from specdec.models.seq2seq import decoder_start_token_id

VOCAB = 64
random.seed(0)
SOURCES = [[random.randrange(2, VOCAB) for _ in range(n)] for n in (7, 1, 3, 18, 5)]  # 18 > 16: a wider source
VERSIONS = {
    "v1.0": {},  # relu, tied embeddings, outputs scaled by d_model^-0.5
    "v1.1": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False),  # what the zoo builds
}
make_t5 = partial(seq2seq_models.make_t5, vocab=VOCAB)


@pytest.fixture(scope="module")
def pairs():
    return {v: (make_t5(0, **kw), make_t5(1, layers=1, d_model=16, **kw)) for v, kw in VERSIONS.items()}


def assert_close_logits(ours: torch.Tensor, ref: torch.Tensor) -> None:
    scale = float(ref.abs().max()) if ref.numel() else 0.0
    torch.testing.assert_close(ours, ref, atol=2e-5 * scale + 1e-5, rtol=1e-4)


@pytest.mark.parametrize("version", VERSIONS)
def test_logits_equal_transformers_through_calls_and_crops(version, pairs):
    model = pairs[version][0]
    rng = random.Random(1)
    texts = [[0] + [rng.randrange(2, VOCAB) for _ in range(14)] for _ in SOURCES]
    refs = [teacher_forced_logits(model, s, t) for s, t in zip(SOURCES, texts)]
    target = FastSeq2SeqTarget(model, max_draft_tokens=6)
    target.begin(SOURCES, max_new_tokens=16)
    text = torch.tensor(texts)
    got = [target.forward(text[:, :1]), target.forward(text[:, 1:5])]  # k = 1, then k > 1
    for b in range(len(SOURCES)):
        assert_close_logits(torch.cat([g[b] for g in got]), refs[b][:5])
    lengths = torch.tensor([3, 1, 5, 2, 4])  # rollback to different lengths per row
    target.crop(lengths)
    block = torch.stack([text[b, n : n + 4] for b, n in enumerate(lengths.tolist())])
    logits = target.forward(block)
    for b, n in enumerate(lengths.tolist()):
        assert_close_logits(logits[b], refs[b][n : n + 4])
    # a padded block: row b feeds its first counts[b] tokens (valid), the rest is padding
    target.crop(lengths)
    counts = torch.tensor([2, 4, 1, 3, 0])
    valid = torch.arange(4)[None, :] < counts[:, None]
    logits = target.forward(block, valid)
    for b, (n, c) in enumerate(zip(lengths.tolist(), counts.tolist())):
        assert_close_logits(logits[b, :c], refs[b][n : n + c])
    assert torch.equal(target.lengths, lengths + counts)
    keep = torch.tensor([3, 0])  # rows leave the batch (the loop keeps them; other callers may not)
    target.select_rows(keep)
    lengths = (lengths + counts)[keep]
    block = torch.stack([text[b, n : n + 2] for b, n in zip(keep.tolist(), lengths.tolist())])
    logits = target.forward(block)
    for row, (b, n) in enumerate(zip(keep.tolist(), lengths.tolist())):
        assert_close_logits(logits[row], refs[b][n : n + 2])


@pytest.mark.parametrize("version", VERSIONS)
def test_encoder_equals_transformers_with_padding(version, pairs):
    model = pairs[version][0]
    fast = FastSeq2SeqTarget(model).model
    width = source_width(max(map(len, SOURCES)))
    ids = torch.zeros(len(SOURCES), width, dtype=torch.long)
    mask = torch.zeros(len(SOURCES), width, dtype=torch.bool)
    for b, source in enumerate(SOURCES):
        ids[b, : len(source)], mask[b, : len(source)] = torch.tensor(source), True
    with torch.no_grad():
        ours = fast.encode(ids, mask)
        for b, source in enumerate(SOURCES):
            ref = model.get_encoder()(input_ids=torch.tensor([source])).last_hidden_state[0]
            assert_close_logits(ours[b, : len(source)], ref)


def test_graph_bodies_never_read_device_data_on_the_host(pairs):
    """encode_into, forward and the drafter's γ steps run on the meta device: no .item(), no host branching
    on tensor values, no host-made tensors, so on CUDA they can be captured in graphs."""
    from specdec.fast.t5 import FastT5, T5Shape
    from specdec.drafters.base import LoopDraws
    from specdec.drafters.model import chain_proposal
    from specdec.fast.target import PairFeed, pair_inputs

    fast = FastT5(T5Shape.from_hf(pairs["v1.1"][0].config), device="meta", dtype=torch.float32)
    cache = fast.new_cache(2, 20, 16)
    with torch.inference_mode():
        fast.encode_into(torch.zeros(2, 16, dtype=torch.long, device="meta"),
                         torch.ones(2, 16, dtype=torch.bool, device="meta"), cache)
        assert fast(torch.zeros(2, 4, dtype=torch.long, device="meta"), cache).shape == (2, 4, VOCAB)
        inputs = pair_inputs(torch.zeros(2, 10, dtype=torch.long, device="meta"),
                             torch.ones(2, dtype=torch.long, device="meta"))
        inputs["noise"] = torch.empty(2, 3, VOCAB, device="meta")
        for sampling in (specdec.SamplingConfig(temperature=0), specdec.SamplingConfig(temperature=0.7, top_p=0.9)):
            draws = LoopDraws(sampling, None, noise=inputs["noise"], host_stop=False)  # (the graph body's draws)
            assert chain_proposal(PairFeed(fast, cache), inputs, draws, 3).tokens.shape == (2, 3)


def greedy_reference(model, source, max_new_tokens, eos):
    """transformers' greedy translation of one source (eos: a non-empty list), cut after the first EOS."""
    out = model.generate(torch.tensor([source], device=model.device), do_sample=False, max_new_tokens=max_new_tokens,
                         eos_token_id=eos)[0, 1:].tolist()
    return next((out[: i + 1] for i, t in enumerate(out) if t in eos), out)


def assert_same_greedy(model, source, ours, ref):
    """Token equality; where they first differ, the target's top-2 margin must be a float tie."""
    if ours == ref:
        return
    i = next((j for j, (a, b) in enumerate(zip(ours, ref)) if a != b), min(len(ours), len(ref)))
    text = [decoder_start_token_id(model)] + ref[:i]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([source], device=model.device),
                       decoder_input_ids=torch.tensor([text], device=model.device)).logits[0, -1].float()
    top2 = logits.topk(2).values
    assert float(top2[0] - top2[1]) < 1e-4, f"outputs differ at token {i}: ours={ours} ref={ref}"


@pytest.mark.parametrize("version", VERSIONS)
def test_greedy_equals_transformers(version, pairs):
    model, draft = pairs[version]
    eos = [1, 7]
    refs = [greedy_reference(model, s, 16, eos) for s in SOURCES]
    target = FastSeq2SeqTarget(model, max_draft_tokens=8)
    drafters = {"none": None, "fast_small": FastSeq2SeqDrafter(draft, max_draft_tokens=8),
                "fast_self": FastSeq2SeqDrafter(model, max_draft_tokens=8), "hf_small": draft}
    for name, drafter in drafters.items():
        for gamma in (1, 4):
            res = specdec.generate(target, SOURCES, drafter=drafter, temperature=0, max_new_tokens=16,
                                   num_draft_tokens=gamma, eos_token_id=eos)
            for source, ours, ref in zip(SOURCES, res.sequences, refs):
                assert_same_greedy(model, source, ours, ref)
            if name == "fast_self":
                assert res.stats.alpha == pytest.approx(1.0)


class CheckingDrafter(Drafter):
    """Wraps a FastSeq2SeqDrafter; checks every row's reported q against the drafter model, teacher-forced."""

    def __init__(self, inner, hf_model, sampling: specdec.SamplingConfig):
        self.inner, self.hf_model, self.sampling = inner, hf_model, sampling
        self.vocab_size, self.drop_finished_rows, self.checked = inner.vocab_size, False, 0

    def begin(self, context, vocab_size):
        self.inner.begin(context, vocab_size)

    def propose(self, context, num_draft_tokens, sampling, generator, confidence_threshold=None):
        proposal = self.inner.propose(context, num_draft_tokens, sampling, generator, confidence_threshold)
        for b in range(context.batch_size):
            start = decoder_start_token_id(self.hf_model)
            text = [start] + context.row(b)[1:] + proposal.tokens[b, :-1].tolist()
            logits = teacher_forced_logits(self.hf_model, context.source[b], text)[-num_draft_tokens:]
            torch.testing.assert_close(proposal.probs[b], specdec.standardize_logits(logits, self.sampling),
                                       atol=1e-5, rtol=1e-4)
            self.checked += 1
        return proposal


def test_fast_drafter_with_transformers_target_and_its_own_start_token():
    target, draft = make_t5(0), make_t5(1, layers=1, d_model=16, feed_forward_proj="gated-gelu")
    draft.config.decoder_start_token_id = draft.generation_config.decoder_start_token_id = 5
    drafter = FastSeq2SeqDrafter(draft)
    assert drafter.model.start_token_id == 5  # it reads the target's text behind its own start token
    checking = CheckingDrafter(drafter, draft, specdec.SamplingConfig(temperature=1.0))
    specdec.generate(target, SOURCES, drafter=checking, max_new_tokens=8, num_draft_tokens=2, seed=0,
                     eos_token_id=[], temperature=1.0)
    assert checking.checked > len(SOURCES)
    res = specdec.generate(target, SOURCES, drafter=FastSeq2SeqDrafter(draft), temperature=0, max_new_tokens=12,
                           num_draft_tokens=3, eos_token_id=[1])
    for source, ours in zip(SOURCES, res.sequences):
        assert_same_greedy(target, source, ours, greedy_reference(target, source, 12, [1]))


def test_sampling_is_seeded_and_reports_the_q_it_sampled_from(pairs):
    model, draft = pairs["v1.1"]
    kw = dict(max_new_tokens=12, num_draft_tokens=3, temperature=0.9, top_k=8, eos_token_id=[4])
    sampling = specdec.SamplingConfig(temperature=0.9, top_k=8)
    target = FastSeq2SeqTarget(model)
    checking = CheckingDrafter(FastSeq2SeqDrafter(draft), draft, sampling)
    first = specdec.generate(target, SOURCES, drafter=checking, seed=3, **kw)
    assert checking.checked > len(SOURCES)
    again = specdec.generate(target, SOURCES, drafter=FastSeq2SeqDrafter(draft), seed=3, **kw)
    assert first.sequences == again.sequences
    assert all(0 < len(s) <= 12 and all(0 <= t < VOCAB for t in s) for s in first.sequences)
    same = specdec.generate(target, SOURCES, drafter=FastSeq2SeqDrafter(model), seed=0, max_new_tokens=16,
                            num_draft_tokens=3, temperature=1.0, eos_token_id=[])
    assert same.stats.alpha == pytest.approx(1.0, abs=1e-5)  # q = p: every draft accepted


class LyingDrafter(Drafter):
    """Negative control: samples from its model but reports a uniform q."""

    def __init__(self, inner):
        self.inner, self.vocab_size, self.drop_finished_rows = inner, inner.vocab_size, False

    def begin(self, context, vocab_size):
        self.inner.begin(context, vocab_size)

    def propose(self, context, num_draft_tokens, sampling, generator, confidence_threshold=None):
        proposal = self.inner.propose(context, num_draft_tokens, sampling, generator, confidence_threshold)
        return Proposal(proposal.tokens, torch.full_like(proposal.probs, 1.0 / VOCAB_LAW), proposal.lengths,
                        proposal.forward_passes)


VOCAB_LAW = 16


def test_first_two_tokens_follow_the_exact_target_law():
    np = pytest.importorskip("numpy")
    pytest.importorskip("scipy")
    from stats_utils import chi2_pvalue

    target, draft = seq2seq_models.make_t5(0, vocab=VOCAB_LAW), seq2seq_models.make_t5(1, layers=1, d_model=16,
                                                                                        vocab=VOCAB_LAW)
    source, rows = [3, 7, 5, 9, 3, 7, 12], 3_000
    decoder = torch.stack([torch.zeros(VOCAB_LAW, dtype=torch.long), torch.arange(VOCAB_LAW)], dim=1)
    with torch.no_grad():
        probs = target(input_ids=torch.tensor([source] * VOCAB_LAW), decoder_input_ids=decoder).logits.double().softmax(-1)
    law = (probs[0, 0][:, None] * probs[:, 1]).flatten().numpy()

    def pvalue(drafter):
        res = specdec.generate(FastSeq2SeqTarget(target), [source] * rows, drafter=drafter, max_new_tokens=3,
                               num_draft_tokens=3, seed=0, temperature=1.0, eos_token_id=[])
        assert 0 < res.stats.accepted_tokens < res.stats.drafted_tokens
        return chi2_pvalue(np.array([s[0] * VOCAB_LAW + s[1] for s in res.sequences]), law)

    assert pvalue(FastSeq2SeqDrafter(draft)) > 1e-3
    assert pvalue(LyingDrafter(FastSeq2SeqDrafter(draft))) < 1e-6


def test_refuses_what_it_does_not_cover(pairs):
    bart = seq2seq_models.make_bart(0, vocab=VOCAB)
    tanh = make_t5(0, feed_forward_proj="tanh")
    quantized = make_t5(0)
    attention = quantized.decoder.block[0].layer[0].SelfAttention
    attention.q.weight = torch.nn.Parameter(attention.q.weight.detach().to(torch.int8), requires_grad=False)
    cases = ((bart, "model_type 't5'"), (tanh, "feed_forward_proj"), (torch.nn.Linear(2, 2), "T5"),
             (quantized, "floating-point"))
    for model, words in cases:
        assert not covers_seq2seq(model)
        with pytest.raises((ValueError, TypeError), match=words):
            FastSeq2SeqTarget(model)
        with pytest.raises((ValueError, TypeError), match=words):
            FastSeq2SeqDrafter(model)
    assert covers_seq2seq(pairs["v1.0"][0]) and covers_seq2seq(pairs["v1.1"][1])
    with pytest.raises(ValueError, match="cuda_graphs"):
        FastSeq2SeqTarget(pairs["v1.1"][0], device="cpu", cuda_graphs=True)
    target = FastSeq2SeqTarget(pairs["v1.1"][0], max_draft_tokens=2)
    target.begin(SOURCES[:1], max_new_tokens=8)
    with pytest.raises(ValueError, match="max_draft_tokens"):
        target.forward(torch.zeros(1, 4, dtype=torch.long))
    for sources, words in (([], "prompts is empty: give at least one encoder input"),
                           ([[5], []], "prompt 1 is empty: every encoder input needs at least one token")):
        with pytest.raises(ValueError, match=words):  # (the transformers target's check, `models.seq2seq`)
            target.begin(sources, max_new_tokens=8)
    assert [source_width(n) for n in (1, 16, 17, 100)] == [16, 16, 32, 128]


def test_table2_measurement_picks_the_fast_path(pairs):
    from specdec.bench.ende_tables import speed_models, speed_table

    model, draft = pairs["v1.1"]
    bigram = specdec.NGramDrafter(2).fit([[0] + s for s in SOURCES], VOCAB)
    drafters = {"bigram": bigram, "small": draft}
    assert speed_models(model, drafters, 3)[2] == "transformers"  # "auto" on CPU
    assert speed_models(model, {"bart": seq2seq_models.make_bart(0, vocab=VOCAB)}, 3, "always")[2] == "transformers"
    target, fast, path = speed_models(model, drafters, 3, "always")
    assert path == "fast" and isinstance(target, FastSeq2SeqTarget) and isinstance(fast["small"].state, FastSeq2SeqState)
    assert fast["bigram"] is bigram
    rows = speed_table(target, fast, SOURCES[:2], gammas=(1, 3), temperatures=(0.0,), max_new_tokens=6, warmup=True)
    assert len(rows) == 1 + 2 * 2 and all(r["tokens_per_s"] > 0 for r in rows)


# -- CUDA: graphs equal eager; fp32 equals transformers; bf16 runs -------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_graphs_equal_eager_on_cuda(temperature, pairs):
    model, draft = (copy.deepcopy(m).to("cuda") for m in pairs["v1.1"])
    kw = dict(temperature=temperature, max_new_tokens=16, num_draft_tokens=3, eos_token_id=[1], seed=0)
    outs = []
    for graphs in (False, True):
        target = FastSeq2SeqTarget(model, cuda_graphs=graphs)
        drafter = FastSeq2SeqDrafter(draft, cuda_graphs=graphs)
        outs.append([specdec.generate(target, SOURCES, drafter=drafter, **kw).sequences for _ in range(2)])
    assert outs[0] == outs[1]
    print(f"T={temperature}: graphs == eager on {len(SOURCES)} ragged sources, twice (graph reuse)")


@pytest.mark.gpu
@cuda
def test_greedy_equals_transformers_on_cuda(pairs):
    model, draft = (copy.deepcopy(m).to("cuda") for m in pairs["v1.1"])
    target, drafter = FastSeq2SeqTarget(model), FastSeq2SeqDrafter(draft)
    assert target.cuda_graphs and drafter.state.lm.cuda_graphs
    for source in SOURCES:
        ref = greedy_reference(model, source, 16, [1])
        for gamma in (1, 4):
            ours = specdec.generate(target, [source], drafter=drafter, temperature=0, max_new_tokens=16,
                                    num_draft_tokens=gamma, eos_token_id=[1]).sequences[0]
            assert_same_greedy(model, source, ours, ref)
    rows = specdec.generate(target, SOURCES, drafter=drafter, temperature=0, max_new_tokens=16, num_draft_tokens=4,
                            eos_token_id=[]).sequences
    plain = specdec.generate(target, SOURCES, temperature=0, max_new_tokens=16, eos_token_id=[]).sequences
    for source, ours, ref in zip(SOURCES, rows, plain):  # a ragged batch, graphs per k, against plain decoding
        assert_same_greedy(model, source, ours, ref)
    print("fp32 CUDA graphs: greedy == transformers for every source and γ ∈ {1, 4}")


@pytest.mark.gpu
@cuda
def test_bf16_runs_on_cuda(pairs):
    model, draft = (copy.deepcopy(m).to("cuda") for m in pairs["v1.1"])
    target = FastSeq2SeqTarget(model, dtype=torch.bfloat16)
    drafter = FastSeq2SeqDrafter(draft, dtype=torch.bfloat16)
    kw = dict(temperature=0, max_new_tokens=16, eos_token_id=[])
    plain = specdec.generate(target, SOURCES, **kw)
    spec = specdec.generate(target, SOURCES, drafter=drafter, num_draft_tokens=4, **kw)
    same = sum(a == b for a, b in zip(plain.sequences, spec.sequences))
    assert same >= len(SOURCES) - 1  # bf16 verification of γ+1 tokens vs 1-token steps may round differently
    sampled = specdec.generate(target, SOURCES, drafter=drafter, num_draft_tokens=4, temperature=1.0, seed=0,
                               max_new_tokens=16, eos_token_id=[])
    assert all(len(s) == 16 for s in sampled.sequences)
    print(f"bf16: {same}/{len(SOURCES)} greedy rows equal plain decoding; α = {spec.stats.alpha:.3f}")
