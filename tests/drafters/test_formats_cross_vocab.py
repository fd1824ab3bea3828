"""Drafting with another tokenizer (`CrossVocabDrafter`, token-level intersection) on both runners: batched greedy
output identical to plain decoding, the loop's drafts are the draft's argmax over the shared tokens of its spelled
text, and the joint law of two tokens at T > 0 is the target's (chi-square), with misreported-q negative controls."""

import numpy as np
import pytest
import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers

import specdec
from helpers import RAGGED_PROMPTS, hf_greedy
from specdec.core import SamplingConfig
from specdec.drafters.base import Proposal
from specdec.drafters.cross_vocab import CrossVocabDrafter, VocabBridge, bridge_if_needed
from stats_utils import chi2_pvalue
from test_distribution import PROMPT, engine_two_token_pairs, exact_two_token_law

PASS, FAIL = 1e-3, 1e-8
SPECIALS = ["[UNK]", "[PAD]", "[BOS]", "[EOS]"]


def tokenizer(words: list[str]):
    vocab = {w: i for i, w in enumerate(words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                                                bos_token="[BOS]", eos_token="[EOS]")


def pair(make_llama, vocab: int, shared: int, extra: int, seed: int = 0):
    """A target over words w0.. (+ specials) and a draft whose tokenizer keeps `shared` of them in another order
    plus `extra` words of its own; the draft model is the target with its rows re-indexed (so it guesses well
    where the target's choice is shared) and random rows for its own words."""
    words = [f"w{i}" for i in range(vocab - len(SPECIALS))]
    target_words = SPECIALS + words
    gen = torch.Generator().manual_seed(seed)
    kept = [words[i] for i in torch.randperm(len(words), generator=gen)[:shared].tolist()]
    draft_words = SPECIALS + kept + [f"z{i}" for i in range(extra)]
    target = make_llama(seed, vocab=vocab)
    with torch.no_grad():
        target.lm_head.weight.mul_(4.0)  # peaked: greedy drafts agree often
    draft = make_llama(seed, vocab=len(draft_words))
    index = {w: i for i, w in enumerate(target_words)}
    with torch.no_grad():
        draft.load_state_dict({k: v for k, v in target.state_dict().items()
                               if "embed_tokens" not in k and "lm_head" not in k}, strict=False)
        for d, w in enumerate(draft_words):
            if w in index:
                draft.model.embed_tokens.weight[d] = target.model.embed_tokens.weight[index[w]]
                draft.lm_head.weight[d] = target.lm_head.weight[index[w]]
    return target, draft, tokenizer(target_words), tokenizer(draft_words)


@pytest.fixture(scope="module")
def big(make_llama):
    return pair(make_llama, vocab=64, shared=56, extra=6)


def test_bridge_maps_the_shared_tokens(big):
    target, draft, target_tok, draft_tok = big
    bridge = VocabBridge(target_tok, draft_tok)
    assert bridge.num_shared == 56 and bridge.target_vocab_size == 64
    for t, d in zip(bridge.target_ids.tolist(), bridge.draft_ids.tolist()):
        assert target_tok.convert_ids_to_tokens(t) == draft_tok.convert_ids_to_tokens(d)
    unshared = next(t for t in range(4, 64) if int(bridge.target_to_draft[t]) < 0)
    assert bridge.spell(unshared) == [draft_tok.unk_token_id]  # its string is no draft word: the draft's [UNK]
    logits = torch.randn(2, len(draft_tok))
    mapped = bridge.target_logits(logits)
    assert torch.isinf(mapped[:, bridge.target_to_draft < 0]).all()
    torch.testing.assert_close(mapped[:, bridge.target_ids], logits[:, bridge.draft_ids])


class FromScratchDrafter(CrossVocabDrafter):
    """The same drafts without a cache: the draft model re-run over each row's whole spelled text."""

    def propose(self, context, num_draft_tokens, sampling, generator, confidence_threshold=None):
        self.state._translate(context)
        rows = []
        for text in self.state._text:
            seq, row = list(text), []
            for _ in range(num_draft_tokens):
                with torch.no_grad():
                    logits = self.model(torch.tensor([seq])).logits[0, -1]
                token = int(self.bridge.target_logits(logits[None].float())[0].argmax())
                row.append(token)
                seq.append(int(self.bridge.target_to_draft[token]))
            rows.append(row)
        return Proposal(tokens=torch.tensor(rows), forward_passes=num_draft_tokens)

    def commit(self, context):
        self.state._translate(context)


@pytest.mark.parametrize("gamma", [1, 3])
def test_batched_greedy_is_the_targets_and_drafts_follow_the_spelled_text(big, gamma):
    target, draft, target_tok, draft_tok = big
    prompts = RAGGED_PROMPTS + [list(range(4, 40)), [50, 51, 52, 53]]
    kwargs = dict(max_new_tokens=20, temperature=0, num_draft_tokens=gamma, eos_token_id=[], engine="hf")
    res = specdec.generate(target, prompts, drafter=CrossVocabDrafter(draft, VocabBridge(target_tok, draft_tok)),
                           **kwargs)
    assert res.sequences == [hf_greedy(target, p, 20, []) for p in prompts]
    oracle = specdec.generate(target, prompts, drafter=FromScratchDrafter(draft, VocabBridge(target_tok, draft_tok)),
                              **kwargs)
    # the cached drafter proposes what the draft model says over the spelled text (rows of different lengths,
    # rejected drafts cropped): the same acceptance, step for step
    assert (res.stats.accepted_tokens, res.stats.drafted_tokens) == \
        (oracle.stats.accepted_tokens, oracle.stats.drafted_tokens)
    assert res.stats.accepted_tokens > res.stats.num_generated_tokens // 4


@pytest.fixture(scope="module")
def small(make_llama):
    return pair(make_llama, vocab=16, shared=8, extra=3, seed=10)


class MisreportingDrafter(CrossVocabDrafter):
    """Negative control: draws from the restricted law but reports the draft's law before the restriction."""

    def propose(self, context, num_draft_tokens, sampling, generator, confidence_threshold=None):
        proposal = super().propose(context, num_draft_tokens, sampling, generator)
        q = proposal.probs
        flat = torch.where(q > 0, q, torch.full_like(q, 0.05))
        return type(proposal)(proposal.tokens, flat / flat.sum(-1, keepdim=True), None, proposal.forward_passes)


@pytest.mark.parametrize("sampling, gamma", [(SamplingConfig(temperature=0.8, top_k=5), 2)])  # (T=1: the engine's)
def test_two_token_law_on_the_loop(small, sampling, gamma):
    target, draft, target_tok, draft_tok = small
    drafter = CrossVocabDrafter(draft, VocabBridge(target_tok, draft_tok))
    res = specdec.generate(target, [PROMPT] * 6000, drafter=drafter, max_new_tokens=3,
                           temperature=sampling.temperature, top_k=sampling.top_k, num_draft_tokens=gamma, seed=1,
                           eos_token_id=[], engine="hf")
    pairs = np.array([s[0] * 16 + s[1] for s in res.sequences])
    assert chi2_pvalue(pairs, exact_two_token_law(target, sampling)) > PASS
    assert 0 < res.stats.alpha < 1


def test_negative_control_a_misreported_q_fails_on_the_loop(small):
    target, draft, target_tok, draft_tok = small
    drafter = MisreportingDrafter(draft, VocabBridge(target_tok, draft_tok))
    res = specdec.generate(target, [PROMPT] * 4000, drafter=drafter, max_new_tokens=3, temperature=1.0,
                           num_draft_tokens=3, seed=1, eos_token_id=[], engine="hf")
    pairs = np.array([s[0] * 16 + s[1] for s in res.sequences])
    assert chi2_pvalue(pairs, exact_two_token_law(target, SamplingConfig(1.0))) < FAIL


def test_tokenizers_sharing_nothing_are_refused():
    with pytest.raises(ValueError, match="share no token"):
        VocabBridge(tokenizer(SPECIALS + ["a", "b"]), tokenizer(SPECIALS + ["c", "d"]))


# ---------------------------------------------------------------------------------------------- the engine
@pytest.mark.parametrize("gamma", [1, 3, "auto"])
def test_engine_greedy_is_the_targets(big, gamma):
    target, draft, target_tok, draft_tok = big
    prompts = RAGGED_PROMPTS + [list(range(4, 40)), [50, 51, 52, 53]]
    drafter = CrossVocabDrafter(draft, VocabBridge(target_tok, draft_tok))
    res = specdec.generate(target, prompts, drafter=drafter, max_new_tokens=20, temperature=0,
                           num_draft_tokens=gamma, eos_token_id=[], engine="fast")
    assert res.sequences == [hf_greedy(target, p, 20, []) for p in prompts]
    assert res.stats.accepted_tokens > res.stats.num_generated_tokens // 4


def _engine_pairs(target, drafter, rows: int):
    from specdec.engine import Engine, EngineConfig

    engine = Engine(target, drafter, EngineConfig(max_batch_size=256, max_seq_len=32, num_draft_tokens=3))
    return engine_two_token_pairs(engine, rows), engine.stats


def test_engine_two_token_law(small):
    target, draft, target_tok, draft_tok = small
    pairs, stats = _engine_pairs(target, CrossVocabDrafter(draft, VocabBridge(target_tok, draft_tok)), 6000)
    assert chi2_pvalue(pairs, exact_two_token_law(target, SamplingConfig(1.0))) > PASS
    assert 0 < stats.alpha < 1


def test_engine_negative_control_a_misreported_q_fails(small, monkeypatch):
    from specdec.engine.drafters import StepView

    target, draft, target_tok, draft_tok = small
    real = StepView.draw

    def flattened(self, logits, position):  # drawn from the restricted law, reported as if unrestricted
        token, q = real(self, logits, position)
        flat = torch.where(q > 0, q, torch.full_like(q, 0.05))
        return token, flat / flat.sum(-1, keepdim=True)

    monkeypatch.setattr(StepView, "draw", flattened)
    pairs, _ = _engine_pairs(target, CrossVocabDrafter(draft, VocabBridge(target_tok, draft_tok)), 2000)
    assert chi2_pvalue(pairs, exact_two_token_law(target, SamplingConfig(1.0))) < FAIL


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_engine_on_cuda_keeps_greedy_exact(big):
    from helpers import assert_same_greedy

    target, draft, target_tok, draft_tok = big
    cuda = target.cuda()
    try:
        drafter = CrossVocabDrafter(draft.cuda(), VocabBridge(target_tok, draft_tok))
        prompts = RAGGED_PROMPTS + [list(range(4, 40))]
        res = specdec.generate(cuda, prompts, drafter=drafter, max_new_tokens=30, temperature=0, num_draft_tokens=3,
                               eos_token_id=[])
        for prompt, out in zip(prompts, res.sequences):
            assert_same_greedy(cuda, prompt, out, hf_greedy(cuda, prompt, 30, []))
    finally:
        target.cpu()
        draft.cpu()


def test_a_draft_folder_with_its_own_tokenizer_gets_a_bridge(big, tmp_path):
    target, draft, target_tok, draft_tok = big
    draft.save_pretrained(tmp_path / "other")
    draft_tok.save_pretrained(tmp_path / "other")
    bridged = bridge_if_needed(draft, tmp_path / "other", target_tok, 64)
    assert isinstance(bridged, CrossVocabDrafter) and bridged.bridge.num_shared == 56
    target_tok.save_pretrained(tmp_path / "same")
    assert bridge_if_needed(target, tmp_path / "same", target_tok, 64) is target  # same tokenizer: the model itself
    assert bridge_if_needed(draft, tmp_path / "none", target_tok, 64) is draft  # no tokenizer of its own
