"""The bitwise-exact mode on the GPU in bf16 (issue 26, item 1), with CUDA graphs: a probe request's greedy tokens
and log-probabilities are the same bits alone at batch 1 with plain decoding, among 63 others at batch 64 (some
admitted mid-flight, mixed greedy / sampled), for every γ 1..8, with speculation on or off; seeded sampled probes
too (sampled rows verify by a shared race: plain decoding's draws). On a random Llama (head dim 32, tiny
vocabulary: many near-ties) and on the shipped demo pair. GPU-marked; skipped without CUDA."""

from pathlib import Path

import pytest
import torch

from specdec.engine import Engine, EngineConfig
from specdec.request import SamplingParams

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

DEMO = Path(__file__).resolve().parents[2] / "specdec" / "assets" / "demo_pair"
NEW = 24


@pytest.fixture(scope="module")
def random_pair(make_llama):
    target, draft = make_llama(0, hidden=128, layers=2), make_llama(1, hidden=128, layers=1)
    with torch.no_grad():  # peaked laws, so drafts are accepted and steps commit several tokens
        target.lm_head.weight.mul_(8.0)
        draft.lm_head.weight.mul_(8.0)
    return target.to("cuda", torch.bfloat16), draft.to("cuda", torch.bfloat16)


@pytest.fixture(scope="module")
def demo_pair():
    transformers = pytest.importorskip("transformers")
    if not (DEMO / "target").is_dir():
        pytest.skip("the demo pair is not shipped in this checkout")
    load = lambda name: transformers.AutoModelForCausalLM.from_pretrained(  # noqa: E731
        DEMO / name, dtype=torch.bfloat16, local_files_only=True).to("cuda").eval()
    return load("target"), load("draft")


def probes(vocab: int, count: int = 6) -> list[list[int]]:
    gen = torch.Generator().manual_seed(11)
    return [torch.randint(3, vocab, (4 + 5 * i,), generator=gen).tolist() for i in range(count)]


def fillers(vocab: int, count: int) -> list[tuple[list[int], SamplingParams]]:
    gen = torch.Generator().manual_seed(12)
    out = []
    for i in range(count):
        prompt = torch.randint(3, vocab, (2 + (7 * i) % 40,), generator=gen).tolist()
        params = SamplingParams(temperature=0 if i % 3 == 0 else 0.8, top_p=0.95, max_new_tokens=8 + (5 * i) % 30,
                                seed=100 + i, logprobs=i % 2 == 0)
        out.append((prompt, params))
    return out


def run(pair, gamma: int, max_batch: int, probe_prompts, params: SamplingParams, crowd=()) -> list:
    """(tokens, log-probabilities) of each probe; the crowd is admitted half before the probes, half mid-flight."""
    target, draft = pair
    config = EngineConfig(max_batch_size=max_batch, max_seq_len=256, num_draft_tokens=max(gamma, 1), bitwise=True)
    engine = Engine(target, draft if gamma else None, config)
    crowd = list(crowd)
    early, late = crowd[: len(crowd) // 2], crowd[len(crowd) // 2 :]
    for prompt, other in early:
        engine.add_request(prompt, other)
    ids = [engine.add_request(prompt, params) for prompt in probe_prompts]
    results = {rid: ([], []) for rid in ids}
    while engine.has_unfinished():
        for _ in range(3):  # a few joiners per step while the probes run
            if late:
                engine.add_request(*late.pop())
        for out in engine.step():
            if out.request_id in results:
                results[out.request_id][0].extend(out.new_token_ids)
                results[out.request_id][1].extend(out.logprobs)
    return [results[rid] for rid in ids]


def assert_identical(reference: list, got: list, what: str) -> None:
    differ = [i for i, (a, b) in enumerate(zip(reference, got)) if a != b]
    assert not differ, f"{what}: probes {differ} differ; first: {reference[differ[0]][0]} vs {got[differ[0]][0]}"


def test_greedy_is_bit_identical_plain_vs_speculative_batch_1_vs_64(random_pair):
    vocab = random_pair[0].config.vocab_size
    prompts, params = probes(vocab), SamplingParams(temperature=0, max_new_tokens=NEW, logprobs=True)
    reference = run(random_pair, 0, 1, prompts, params)  # plain, each probe alone (the others queue)
    assert all(len(tokens) == NEW for tokens, _ in reference)
    crowd = fillers(vocab, 64 - len(prompts))
    assert_identical(reference, run(random_pair, 0, 64, prompts, params, crowd), "plain at batch 64")
    for gamma in range(1, 9):
        assert_identical(reference, run(random_pair, gamma, 64, prompts, params, crowd), f"γ={gamma} at batch 64")
    assert_identical(reference, run(random_pair, 4, 1, prompts, params), "γ=4 at batch 1")


def test_seeded_sampling_is_bit_identical_for_every_gamma_batch_1_vs_64(random_pair):
    """Sampled rows verify by a shared race (`core.verify_coupled`): plain decoding's draws at every γ and batch."""
    vocab = random_pair[0].config.vocab_size
    prompts = probes(vocab)
    params = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, max_new_tokens=NEW, seed=7, logprobs=True)
    reference = run(random_pair, 0, 1, prompts, params)
    crowd = fillers(vocab, 64 - len(prompts))
    for gamma in (0, 1, 4, 8):
        assert_identical(reference, run(random_pair, gamma, 64, prompts, params, crowd),
                         f"seeded, γ={gamma}, batch 64")
    assert_identical(reference, run(random_pair, 3, 1, prompts, params), "seeded, γ=3, batch 1")


def test_demo_pair_greedy_is_bit_identical_plain_vs_speculative(demo_pair):
    vocab = demo_pair[0].config.vocab_size
    prompts, params = probes(vocab), SamplingParams(temperature=0, max_new_tokens=NEW, logprobs=True)
    reference = run(demo_pair, 0, 1, prompts, params)
    crowd = fillers(vocab, 64 - len(prompts))
    for gamma in (1, 4, 8):
        assert_identical(reference, run(demo_pair, gamma, 64, prompts, params, crowd), f"demo pair γ={gamma}")
