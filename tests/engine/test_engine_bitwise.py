"""Bit for bit on a CPU in fp32. By default a request's tokens do not depend on what else is in the batch
(admitted before it, mid-flight, queued behind a full batch) nor, when greedy, on γ (plain decoding included); its
log-probabilities may (the GEMMs and SDPA calls of another batch shape may round differently, depending on the
host's kernels; a deliberately row-count-dependent GEMM shows the comparison would see it). With `EngineConfig(bitwise=True)` (the batch-invariant kernels, issue 26 item 1) the
log-probabilities are the same bits too: across batches, admissions, γ = 0..8 and drafters, and across prefill
chunk sizes."""

import pytest
import torch

from specdec.engine import Engine, EngineConfig
from specdec.request import SamplingParams
from variant_kernels import patch_cpu_gemms

PROMPT = [5, 6, 7, 8]
OTHERS = [[1, 2], [9, 9, 9, 9], [3] * 12, [4, 4, 9], [11, 12, 13]]
#: (max batch, other requests, admitted mid-flight): alone; three admitted first; five admitted one per step while
#: it runs, with two slots (the others queue) and with eight (batch buckets 1 → 8 as they arrive)
BATCHES = [(1, 0, False), (4, 3, False), (2, 5, True), (8, 5, True)]


@pytest.fixture(scope="module")
def pair(peaked_pair):
    return peaked_pair


def run(pair, gamma: int, max_batch: int, others: int, mid_flight: bool, params: SamplingParams,
        prompt=PROMPT, drafter=None, **config):
    """The tokens and log-probabilities of the request on `prompt`, among `others` other requests."""
    target, draft = pair
    config = EngineConfig(max_batch_size=max_batch, max_seq_len=128, num_draft_tokens=max(gamma, 1), **config)
    engine = Engine(target, (drafter or draft) if gamma else None, config)
    crowd = [(p, SamplingParams(temperature=0.9 if i % 2 else 0, top_p=0.9, max_new_tokens=9 + i, seed=i,
                                logprobs=True)) for i, p in enumerate(OTHERS[:others])]
    if not mid_flight:
        for other_prompt, other in crowd:
            engine.add_request(other_prompt, other)
        crowd = []
    rid = engine.add_request(prompt, params)
    tokens, logprobs = [], []
    while engine.has_unfinished():
        if crowd:
            engine.add_request(*crowd.pop(0))
        for out in engine.step():
            if out.request_id == rid:
                tokens += out.new_token_ids
                logprobs += list(out.logprobs)
    return tokens, logprobs


def test_greedy_tokens_are_identical_across_batches_and_gamma(pair):
    params = SamplingParams(temperature=0, max_new_tokens=16, logprobs=True)
    runs = {(gamma, *batch): run(pair, gamma, *batch, params)[0] for gamma in (0, 1, 3, 5) for batch in BATCHES}
    reference = runs[(0, 1, 0, False)]
    assert len(reference) == 16
    assert all(tokens == reference for tokens in runs.values()), runs


@pytest.mark.parametrize("gamma", [0, 3])
def test_seeded_tokens_are_identical_across_batches(pair, gamma):
    params = SamplingParams(temperature=1.0, top_k=40, max_new_tokens=16, seed=3, logprobs=True)
    runs = [run(pair, gamma, *batch, params)[0] for batch in BATCHES]
    assert len(runs[0]) == 16 and all(tokens == runs[0] for tokens in runs), runs


def test_the_logprob_comparison_finds_a_row_count_dependent_gemm(pair, monkeypatch):
    """The negative control of the bitwise tests below, by construction on every host: in the default mode, with the
    CPU GEMMs replaced by one whose last bit depends on the rows in the call (`variant_kernels`), a request's
    log-probabilities differ between running alone and running among others. (The default kernels themselves keep or
    change a row's bits with the row count depending on the CPU, so they prove nothing either way; the default mode
    promises tokens, not log-probability bits.)"""
    patch_cpu_gemms(monkeypatch)
    params = SamplingParams(temperature=1.0, max_new_tokens=16, seed=3, logprobs=True)
    runs = [run(pair, 0, *batch, params)[1] for batch in BATCHES]
    assert all(logprobs != runs[0] for logprobs in runs[1:])


# ------------------------------------------------------------------------------------------------ bitwise mode
def test_bitwise_greedy_tokens_and_logprobs_are_identical_across_batches_gamma_and_drafters(pair, make_llama):
    """Plain decoding alone is the reference; every γ 1..8 and batch (admissions before, mid-flight, queued) gives
    the same tokens and the same log-probability bits; so does another drafter."""
    params = SamplingParams(temperature=0, max_new_tokens=16, logprobs=True)
    reference = run(pair, 0, *BATCHES[0], params, bitwise=True)
    assert len(reference[0]) == 16
    cases = [(gamma, batch) for gamma in range(0, 9) for batch in BATCHES if (gamma, batch) != (0, BATCHES[0])]
    differ = [case for case in cases if run(pair, case[0], *case[1], params, bitwise=True) != reference]
    assert differ == []
    other_drafter = make_llama(2, layers=1)  # (untuned: proposes other tokens, accepted less often)
    for gamma in (2, 5):
        assert run(pair, gamma, *BATCHES[3], params, drafter=other_drafter, bitwise=True) == reference


@pytest.mark.parametrize("gamma", [0, 4])
def test_bitwise_seeded_tokens_and_logprobs_are_identical_across_batches(pair, gamma):
    params = SamplingParams(temperature=1.0, top_k=40, top_p=0.95, max_new_tokens=16, seed=3, logprobs=True)
    runs = [run(pair, gamma, *batch, params, bitwise=True) for batch in BATCHES]
    assert len(runs[0][0]) == 16 and all(r == runs[0] for r in runs), runs


def test_bitwise_mode_does_not_use_the_default_gemms(pair, monkeypatch):
    """Under the same row-count-dependent GEMM as the control above, the mode's log-probabilities stay the same bits:
    its kernels do not go through the host's default products."""
    patch_cpu_gemms(monkeypatch)
    params = SamplingParams(temperature=1.0, max_new_tokens=16, seed=3, logprobs=True)
    runs = [run(pair, 3, *batch, params, bitwise=True) for batch in BATCHES]
    assert all(r == runs[0] for r in runs[1:])


def test_bitwise_logprobs_do_not_depend_on_the_prefill_chunk(pair):
    """Beyond what the mode promises: every position's computation is invariant, so a 40-token prompt prefilled in
    chunks of 16 leaves the same cache bits as in one chunk of 512."""
    params = SamplingParams(temperature=0, max_new_tokens=8, logprobs=True)
    prompt = [(7 * i) % 60 + 2 for i in range(40)]
    runs = [run(pair, 3, 4, 3, False, params, prompt=prompt, prefill_chunk=chunk, bitwise=True) for chunk in (16, 512)]
    assert runs[0] == runs[1]


def test_bitwise_mode_is_refused_where_it_does_not_hold(make_gpt2):
    with pytest.raises(TypeError, match="bitwise"):
        EngineConfig(bitwise="yes")
    with pytest.raises(ValueError, match="bitwise"):
        Engine(make_gpt2(0), None, EngineConfig(max_batch_size=2, max_seq_len=64, bitwise=True))


def test_bitwise_seeded_sampling_is_plain_decoding_for_every_gamma_and_drafter(pair, make_llama):
    """Sampled rows verify by a shared race (`core.verify_coupled`): each position's token is the one plain decoding
    draws there, so seeded output and log-probabilities are the same bits for γ = 0..8, any drafter, any batch."""
    params = SamplingParams(temperature=0.9, top_p=0.95, max_new_tokens=16, seed=5, logprobs=True)
    reference = run(pair, 0, *BATCHES[0], params, bitwise=True)
    assert len(reference[0]) == 16
    cases = [(gamma, BATCHES[gamma % len(BATCHES)]) for gamma in range(1, 9)]
    assert [case for case in cases if run(pair, case[0], *case[1], params, bitwise=True) != reference] == []
    assert run(pair, 3, *BATCHES[2], params, drafter=make_llama(2, layers=1), bitwise=True) == reference


def test_bitwise_coupled_drafts_are_accepted(pair):
    """The drafter races q with the target's noise, so drafts are accepted about as often as in exact sampling
    (here: most of them, the pair's laws are peaked) — not the Σ p·q of independent draws."""
    target, draft = pair
    engine = Engine(target, draft, EngineConfig(max_batch_size=1, max_seq_len=128, num_draft_tokens=4, bitwise=True))
    engine.add_request(PROMPT, SamplingParams(temperature=1.0, max_new_tokens=40, seed=9))
    while engine.has_unfinished():
        engine.step()
    stats = engine.stats
    assert stats.num_steps < 40 / 1.5, stats  # more than 1.5 tokens per step on average


def test_bitwise_refuses_leniency(pair):
    engine = Engine(*pair, EngineConfig(max_batch_size=1, max_seq_len=64, num_draft_tokens=2, bitwise=True))
    with pytest.raises(ValueError, match="leniency"):
        engine.add_request(PROMPT, SamplingParams(temperature=0, leniency=0.5, max_new_tokens=4))


COMMON = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)


@pytest.mark.parametrize("family", ["mistral-window", "qwen3"])
def test_bitwise_holds_for_windows_and_qk_norms(family):
    """Other Llama-body families: a sliding window shorter than the text (Mistral), q/k norms (Qwen3): the
    request's logprobs are the same bits plain at batch 1 and speculative among others."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(3)
    if family == "mistral-window":
        make = lambda: transformers.MistralForCausalLM(transformers.MistralConfig(**COMMON, sliding_window=6))  # noqa: E731
    else:
        make = lambda: transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**COMMON, head_dim=8))  # noqa: E731
    target, draft = make().eval(), make().eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(8.0)
    params = SamplingParams(temperature=0, max_new_tokens=20, logprobs=True)
    reference = run((target, draft), 0, 1, 0, False, params, bitwise=True)
    assert len(reference[0]) == 20
    assert run((target, draft), 3, 8, 5, True, params, bitwise=True) == reference
    sampled = SamplingParams(temperature=0.8, max_new_tokens=20, seed=4, logprobs=True)
    assert run((target, draft), 2, 4, 3, False, sampled, bitwise=True) == run((target, draft), 0, 1, 0, False, sampled,
                                                                              bitwise=True)
