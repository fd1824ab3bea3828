from __future__ import annotations

from transformers import AutoTokenizer

from specdec.zoo.tokenizer import train_bpe_tokenizer

TEXTS = ["def f(x):\n    return x + 1\n", "class A:\n\tpass  # tabs\n", "naïve Grüße 😀\r\n"] * 20


def test_round_trip_and_autotokenizer(tmp_path):
    tok = train_bpe_tokenizer(TEXTS, vocab_size=300)
    tok.save_pretrained(str(tmp_path))
    loaded = AutoTokenizer.from_pretrained(str(tmp_path))
    assert (loaded.pad_token_id, loaded.bos_token_id, loaded.eos_token_id) == (0, 1, 2)
    for text in TEXTS[:3] + ["  leading spaces\n\n\n", "unseen ∑ symbols 漢字"]:
        ids = loaded(text)["input_ids"]
        assert 2 not in ids  # decoder-only tokenizer adds nothing
        assert loaded.decode(ids) == text
    assert loaded("def f(x):")["input_ids"] == tok("def f(x):")["input_ids"]


def test_append_eos_variant(tmp_path):
    tok = train_bpe_tokenizer(TEXTS, vocab_size=300, append_eos=True)
    tok.save_pretrained(str(tmp_path))
    loaded = AutoTokenizer.from_pretrained(str(tmp_path))
    ids = loaded("Grüße")["input_ids"]
    assert ids[-1] == loaded.eos_token_id == 2
    assert loaded.decode(ids, skip_special_tokens=True) == "Grüße"
