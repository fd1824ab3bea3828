"""Processors that read the text itself (not only counts): banned next tokens along a draft, graph-safe.

`ngram_bans`: transformers' `no_repeat_ngram_size`; `word_bans`: bad words (transformers' `bad_words_ids`, vLLM's
`bad_words` once tokenized); `text_bans`: both for a batch's rows (`core.processors.ProcessorRows`). Each returns
bool `[B, γ+1, V]` for positions 1..γ+1 of a step: position i + 1 sees the committed text followed by x_1..x_i.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from specdec.core.processors import ProcessorRows

__all__ = ["MAX_BAD_WORDS", "MAX_BAD_WORD_TOKENS", "MAX_NGRAM_SIZE", "check_bad_words", "words_tensor", "ngram_bans",
           "word_bans", "text_bans"]

MAX_NGRAM_SIZE = 1024  # the largest no_repeat_ngram_size accepted


def _token_id(value, name: str) -> int:
    try:
        token = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        token = None
    if token is None or token < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return token


MAX_BAD_WORDS, MAX_BAD_WORD_TOKENS = 64, 16  # per request


def check_bad_words(value) -> tuple[tuple[int, ...], ...]:
    """Bad words as token-id sequences: at most 64, each of 1 to 16 ids >= 0 → a tuple of tuples."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"bad_words_ids must be a list of token-id lists, got {type(value).__name__}")
    words = []
    for word in value:
        if isinstance(word, (str, bytes)) or not hasattr(word, "__iter__"):
            raise TypeError(f"bad_words_ids must be a list of token-id lists, got an entry {word!r}")
        ids = tuple(_token_id(t, "bad_words_ids entry") for t in word)
        if not 1 <= len(ids) <= MAX_BAD_WORD_TOKENS:
            raise ValueError(f"bad_words_ids: each word has 1 to {MAX_BAD_WORD_TOKENS} tokens, got {len(ids)}")
        words.append(ids)
    if len(words) > MAX_BAD_WORDS:
        raise ValueError(f"bad_words_ids: at most {MAX_BAD_WORDS} words, got {len(words)}")
    return tuple(dict.fromkeys(words))


def words_tensor(rows: Sequence[Sequence[Sequence[int]]], device, count: int = 0, width: int = 0) -> torch.Tensor:
    """Rows of bad words → `[B, S, M]` long, -1 padded (S, M at least `count`, `width`)."""
    count = max([count, 1] + [len(r) for r in rows])
    width = max([width, 1] + [len(w) for r in rows for w in r])
    out = torch.full((len(rows), count, width), -1, dtype=torch.long)
    for b, row in enumerate(rows):
        for s, word in enumerate(row):
            out[b, s, : len(word)] = torch.as_tensor(list(word), dtype=torch.long)
    return out.to(device)


def ngram_bans(text: torch.Tensor, lengths: torch.Tensor, draft: torch.Tensor, size: int, vocab: int,
               rows: torch.Tensor | None = None) -> torch.Tensor:
    """transformers' `no_repeat_ngram_size` along a draft: bool `[B, γ+1, V]`, True = banned at position i + 1
    (a token that would repeat an n-gram of the text committed text + x_1..x_i).

    text [B, L] committed tokens (row b valid in [0, lengths[b])), with L ≥ lengths + γ; draft [B, γ]; size n ≥ 1;
    rows [B] bool (None = all): the rows this applies to. No host synchronization (graph-safe).
    """
    batch, gamma = draft.shape
    device = text.device
    steps = torch.arange(gamma + 1, device=device)
    columns = torch.arange(text.shape[1], device=device)[None, :]
    extended = text.clone()
    if gamma:  # the draft written after each row's text
        at = (lengths[:, None] + torch.arange(gamma, device=device)[None, :]).clamp_max(text.shape[1] - 1)
        extended.scatter_(1, at, draft.long())
    ends = lengths[:, None] + steps[None, :]  # [B, γ+1] the text's length at each position
    banned = torch.zeros(batch, gamma + 1, vocab + 1, dtype=torch.float32, device=device)
    if size > text.shape[1]:
        return banned[..., :vocab].bool()
    windows = extended.unfold(1, size, 1)  # [B, J, n]: window j = tokens j .. j + n − 1
    starts = columns[:, : windows.shape[1]]  # [1, J]
    if size > 1:
        back = ends[:, :, None] - size + 1 + torch.arange(size - 1, device=device)[None, None, :]  # [B, γ+1, n−1]
        suffix = extended.gather(1, back.clamp_min(0).reshape(batch, -1)).reshape(batch, gamma + 1, size - 1)
        match = (windows[:, None, :, : size - 1] == suffix[:, :, None, :]).all(-1)  # [B, γ+1, J]
    else:
        match = torch.ones(batch, gamma + 1, windows.shape[1], dtype=torch.bool, device=device)
    match &= starts[:, None, :] <= ends[:, :, None] - size  # windows inside the text at that position
    match &= (ends >= size - 1)[:, :, None]  # (transformers: nothing is banned before the text has n − 1 tokens)
    if rows is not None:
        match &= rows[:, None, None]
    last = windows[:, None, :, size - 1].expand(batch, gamma + 1, -1)
    banned.scatter_add_(2, last, match.float())
    return banned[..., :vocab] > 0


def word_bans(text: torch.Tensor, lengths: torch.Tensor, draft: torch.Tensor, words: torch.Tensor,
              vocab: int) -> torch.Tensor:
    """Bad words along a draft (transformers' `NoBadWordsLogitsProcessor`, vLLM's `bad_words`): bool `[B, γ+1, V]`,
    True = banned at position i + 1: the last token of a word whose other tokens end the text committed text +
    x_1..x_i (a one-token word: always).

    text [B, L], lengths, draft [B, γ]: as `ngram_bans`; words [B, S, M] long: each row's token sequences,
    left-aligned, -1 = padding (a row of only -1: no word). No host synchronization (graph-safe).
    """
    batch, gamma = draft.shape
    device = text.device
    width = words.shape[2]
    extended = text.clone()
    if gamma:
        at = (lengths[:, None] + torch.arange(gamma, device=device)[None, :]).clamp_max(text.shape[1] - 1)
        extended.scatter_(1, at, draft.long())
    ends = lengths[:, None] + torch.arange(gamma + 1, device=device)[None, :]  # [B, γ+1]
    k = torch.arange(width - 1, device=device)
    back = ends[:, :, None] - (width - 1) + k  # [B, γ+1, M−1]: the text's last M − 1 tokens, right-aligned
    suffix = extended.gather(1, back.clamp_min(0).reshape(batch, -1)).reshape(batch, gamma + 1, width - 1)
    size = (words >= 0).sum(-1)  # [B, S]
    src = size[:, :, None] - width + k  # [B, S, M−1]: the word's tokens but its last, right-aligned
    needed = src >= 0
    prefix = words.gather(2, src.clamp_min(0))
    same = (suffix[:, :, None, :] == prefix[:, None, :, :]) & (back >= 0)[:, :, None, :]
    match = (same | ~needed[:, None, :, :]).all(-1) & (size > 0)[:, None, :]  # [B, γ+1, S]
    last = words.gather(2, (size - 1).clamp_min(0)[:, :, None])[:, :, 0].clamp_min(0)  # [B, S]
    banned = torch.zeros(batch, gamma + 1, vocab, dtype=torch.float32, device=device)
    banned.scatter_add_(2, last[:, None, :].expand(batch, gamma + 1, -1), match.float())
    return banned > 0


def text_bans(rows: "ProcessorRows", sizes: Sequence[int], text: torch.Tensor, lengths: torch.Tensor,
              draft: torch.Tensor, vocab: int) -> torch.Tensor | None:
    """`ngram_bans` for every n in `sizes` (the rows' distinct no_repeat_ngram_size values, known on the host),
    each on the rows asking for it, and `word_bans` of the rows' bad words (`rows.words`) → bool `[B, γ+1, V]`, or
    None when neither applies."""
    banned = None if rows.words is None else word_bans(text, lengths, draft, rows.words, vocab)
    for size in sizes:
        rows_n = None if rows.ngram is None else rows.ngram == size
        bans = ngram_bans(text, lengths, draft, size, vocab, rows_n)
        banned = bans if banned is None else banned | bans
    return banned
