"""Incremental detokenization: pieces are whole characters and concatenate to the decoded text; stop strings."""

from pathlib import Path

import pytest

tokenizers = pytest.importorskip("tokenizers")

from specdec.text.detokenize import IncrementalText  # noqa: E402

DEMO_TOKENIZER = Path(__file__).resolve().parents[2] / "specdec" / "assets" / "demo_pair" / "target" / "tokenizer.json"
TEXTS = ['s = "😀🎉 héllo"\n', "日本語のテキスト、 ok", "naïve café — “quotes” ∑∫ 🧪🧬", "plain ascii\n    return x"]


@pytest.fixture(scope="module")
def tok():
    return tokenizers.Tokenizer.from_file(str(DEMO_TOKENIZER))


def run(tok, ids, stop=(), prompt=(5,)):
    text = IncrementalText(tok, list(prompt), stop)
    pieces = [text.add(i) for i in ids]
    pieces.append(text.finish())
    return text, pieces


@pytest.mark.parametrize("s", TEXTS)
def test_pieces_are_whole_characters_and_concatenate_to_the_text(tok, s):
    ids = tok.encode(s).ids
    text, pieces = run(tok, ids)
    if not s.isascii():  # some character is split over tokens: a token released nothing
        assert "" in pieces[:-1]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == text.text == tok.decode(ids, skip_special_tokens=True) == s


def test_random_token_soup_still_concatenates_to_the_decoded_text(tok):
    import random

    rng = random.Random(0)
    for _ in range(50):
        ids = [rng.randrange(3, tok.get_vocab_size()) for _ in range(rng.randrange(1, 30))]
        text, pieces = run(tok, ids)
        assert "".join(pieces) == text.text == tok.decode(ids, skip_special_tokens=True)


def test_special_tokens_are_skipped(tok):
    ids = tok.encode("a b").ids + [2] + tok.encode(" c").ids
    text, pieces = run(tok, ids)
    assert text.text == "a b c" and "</s>" not in "".join(pieces)


@pytest.mark.parametrize(
    "s, stop, expected",
    [
        ("def f(x):\n    return x\n\ndef g", ["\n\n"], "def f(x):\n    return x"),
        ("alpha beta gamma", ["beta", "alpha"], ""),  # the earliest stop wins
        ("alpha beta gamma", ["gam", "bet"], "alpha "),
        ("😀🎉 party 🎉", ["🎉 "], "😀"),  # a stop string inside multi-byte tokens
        ("no stop here", ["xyz"], "no stop here"),
        ("aaab", ["aab"], "a"),  # a held prefix that turns out to overlap the real stop
    ],
)
def test_stop_strings_cut_before_the_stop_and_never_leak(tok, s, stop, expected):
    ids = tok.encode(s).ids
    text, pieces = run(tok, ids, tuple(stop))
    assert text.text == expected == "".join(pieces)
    assert text.stopped == (expected != s)
    # released text never contains a stop string, at any moment
    released = ""
    for p in pieces:
        released += p
        assert not any(x in released for x in stop)


def test_tokens_after_a_stop_are_ignored_and_token_ids_end_at_the_stop(tok):
    ids = tok.encode("one. two. three").ids
    text, _ = run(tok, ids, (".",))
    assert text.text == "one" and text.stop_string == "."
    assert tok.decode(text.token_ids).endswith(".") and len(text.token_ids) < len(ids)


def test_a_transformers_tokenizer_without_a_rust_backend_uses_the_same_contract(tok):
    class Slow:  # decode() only, like a Python-only tokenizer
        def decode(self, ids, skip_special_tokens=True):
            return tok.decode(ids, skip_special_tokens=skip_special_tokens)

    s = TEXTS[0]
    ids = tok.encode(s).ids
    text, pieces = run(Slow(), ids)
    assert all("\ufffd" not in p for p in pieces) and "".join(pieces) == s


def test_min_tokens_looks_for_stop_strings_only_after_them(tok):
    """vLLM's min_tokens: a stop string in the first min_tokens tokens does not end the text; one after does."""
    ids = tok.encode("one. two. three").ids
    first_stop = next(i for i in range(1, len(ids) + 1) if "." in tok.decode(ids[:i]))
    text = IncrementalText(tok, [5], (".",), min_tokens=first_stop + 1)
    pieces = [text.add(i) for i in ids] + [text.finish()]
    assert text.text.startswith("one.") and text.stop_string == "." and "".join(pieces) == text.text
    assert text.text == "one. two"
