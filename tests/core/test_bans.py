"""`core.bans`: banned next tokens read from the text, along a draft — each equal to transformers' own processor
(`NoRepeatNGramLogitsProcessor`, `NoBadWordsLogitsProcessor`) applied to the committed text + the draft prefix."""

import pytest
import torch

from specdec.request import SamplingParams


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_ngram_bans_are_transformers_no_repeat_ngram_along_the_draft(size):
    from transformers.generation.logits_process import NoRepeatNGramLogitsProcessor

    from specdec.core.processors import ngram_bans

    g = torch.Generator().manual_seed(size)
    vocab, gamma = 6, 4
    for _ in range(20):
        lengths = torch.randint(1, 9, (3,), generator=g)
        text = torch.randint(0, vocab, (3, 12 + gamma), generator=g)
        draft = torch.randint(0, vocab, (3, gamma), generator=g)
        bans = ngram_bans(text, lengths, draft, size, vocab)
        for b in range(3):
            for i in range(gamma + 1):
                ids = torch.cat([text[b, : lengths[b]], draft[b, :i]])[None]
                ref = NoRepeatNGramLogitsProcessor(size)(ids, torch.zeros(1, vocab))[0] == float("-inf")
                assert torch.equal(bans[b, i], ref)
    assert ngram_bans(text, lengths, draft, size, vocab, rows=torch.zeros(3, dtype=torch.bool)).sum() == 0


def test_word_bans_are_transformers_no_bad_words_along_the_draft():
    from transformers.generation.logits_process import NoBadWordsLogitsProcessor

    from specdec.core.processors import word_bans, words_tensor

    g = torch.Generator().manual_seed(0)
    vocab, gamma = 6, 4
    for _ in range(30):
        lengths = torch.randint(1, 9, (3,), generator=g)
        text = torch.randint(0, vocab, (3, 12 + gamma), generator=g)
        draft = torch.randint(0, vocab, (3, gamma), generator=g)
        words = [[torch.randint(0, vocab, (int(torch.randint(1, 4, (1,), generator=g)),), generator=g).tolist()
                  for _ in range(3)] for _ in range(3)]
        bans = word_bans(text, lengths, draft, words_tensor(words, "cpu", 5, 4), vocab)  # (extra padding too)
        for b in range(3):
            for i in range(gamma + 1):
                ids = torch.cat([text[b, : lengths[b]], draft[b, :i]])[None]
                ref = NoBadWordsLogitsProcessor(words[b])(ids, torch.zeros(1, vocab))[0] == float("-inf")
                assert torch.equal(bans[b, i], ref)
    with pytest.raises(ValueError, match="bad_words_ids"):
        SamplingParams(bad_words_ids=[[1] * 17])
    with pytest.raises(ValueError, match="bad_words_ids: 64"):
        SamplingParams(bad_words_ids=[[1, 64]]).check_vocabulary(64)
