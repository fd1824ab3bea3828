"""Logits processors that depend on the text, applied exactly under speculation: pure tensor functions.

A processor turns the target's logits into p̃ (and the drafter's into q̃) from the text so far: penalties,
`logit_bias`, `min_tokens`, and a per-row allowed-token mask (a grammar). Under speculation the text at draft
position i is the committed text followed by the drafts x_1..x_{i-1}, so a processor's value there must be
computed from that prefix — at every drafted position and the bonus position γ+1 — and the state must move
back to the committed text on rejection. Then `core.verify` (unchanged) yields exactly p̃'s law.

Order (transformers' `_get_logits_processor` and vLLM's sampler agree on it): logit_bias → min_tokens (the
EOS/stop ids masked until `min_tokens` tokens were generated) → repetition penalty → frequency and presence
penalties → allowed-token mask → temperature → top-k → top-p → min-p (`core.sampling`). The mask and the
min_tokens mask only write -inf, which every later step keeps, so where they sit among the penalties does not
change a result.

Semantics:
  repetition_penalty r  (transformers' `RepetitionPenaltyLogitsProcessor`, vLLM's `repetition_penalty`): the
                        logit of every token seen in the prompt or the output is divided by r when positive,
                        multiplied by r otherwise; r = 1 off
  frequency_penalty f   (OpenAI, vLLM): minus f × the token's count in the OUTPUT; 0 off
  presence_penalty s    (OpenAI, vLLM): minus s if the token occurs in the OUTPUT; 0 off
  logit_bias            token id → added to its logit (OpenAI, vLLM; transformers' `SequenceBiasLogitsProcessor`
                        with one-token sequences)
  allowed_token_ids     (vLLM) every other token gets -inf, with logit_bias (the same additive row)
  no_repeat_ngram_size  (transformers' `NoRepeatNGramLogitsProcessor`) a token completing an n-gram the text already
                        holds gets -inf (`ngram_bans`: read from the text itself, prompt included)
  bad_words_ids         (transformers' `NoBadWordsLogitsProcessor`, vLLM's `bad_words` once tokenized) the last token
                        of a word whose other tokens end the text gets -inf (`word_bans`)
  min_tokens m          the EOS / stop ids get -inf while fewer than m tokens were generated (transformers'
                        `MinNewTokensLengthLogitsProcessor`, vLLM's `min_tokens`)

The state a row carries (`TokenHistory`): which tokens the prompt holds, how often each token occurs in the
output, how many tokens were generated — rebuilt from committed tokens only, so a rollback costs nothing.
`process_draft` computes positions 1..γ+1 of a step in one vectorized pass: the values under the committed
history for the whole `[B, γ+1, V]` block, then a fix-up of the at most γ columns the drafts touch
(`[B, γ+1, γ]` work). `advance` moves a history along tokens (the drafter's chain: one draft at a time).

A host-side processor (a grammar matcher) plugs in through `TokenConstraint` (see its docstring).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from specdec.core.bans import (  # noqa: F401  (re-exported: the processors' one import place)
    MAX_BAD_WORD_TOKENS,
    MAX_BAD_WORDS,
    MAX_NGRAM_SIZE,
    _token_id,
    check_bad_words,
    ngram_bans,
    text_bans,
    word_bans,
    words_tensor,
)

__all__ = ["MAX_LOGIT_BIAS", "MAX_NGRAM_SIZE", "check_logit_bias", "check_token_ids", "check_bad_words", "words_tensor",
           "word_bans", "ProcessorRows", "TokenHistory", "bias_row", "ngram_bans", "text_bans", "TokenConstraint", "ConstraintSpec", "process_draft", "advance",
           "history_of", "constraint_masks"]

_NEG_INF = float("-inf")
def check_token_ids(value, name: str) -> tuple[int, ...]:
    """A non-empty list of token ids (>= 0; the vocabulary is checked by the runner) → sorted unique ids."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"{name} must be a list of token ids, got {type(value).__name__}")
    ids = tuple(sorted({_token_id(t, f"{name} entry") for t in value}))
    if not ids or len(ids) > MAX_LOGIT_BIAS_ENTRIES:
        raise ValueError(f"{name} must name 1 to {MAX_LOGIT_BIAS_ENTRIES} token ids, got {len(ids)}")
    return ids


MAX_LOGIT_BIAS = 100.0  # OpenAI's range for a logit_bias value
MAX_LOGIT_BIAS_ENTRIES = 1 << 16


def check_logit_bias(value) -> tuple[tuple[int, float], ...]:
    """{token id: bias} (or (id, bias) pairs) → sorted ((id, bias), ...); ids >= 0, biases in [-100, 100]."""
    if value is None:
        return ()
    items = value.items() if isinstance(value, Mapping) else value
    try:
        items = list(items)
    except TypeError:
        raise TypeError(f"logit_bias must be a mapping of token id to bias, got {type(value).__name__}") from None
    if len(items) > MAX_LOGIT_BIAS_ENTRIES:
        raise ValueError(f"logit_bias has {len(items)} entries; at most {MAX_LOGIT_BIAS_ENTRIES}")
    out: dict[int, float] = {}
    for item in items:
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise TypeError(f"logit_bias must be a mapping of token id to bias, got an entry {item!r}")
        token, bias = item
        if isinstance(token, str) and token.strip().lstrip("-").isdigit() and len(token) <= 20:
            token = int(token)  # JSON object keys are strings
        token = _token_id(token, "logit_bias token id")
        if isinstance(bias, bool) or not isinstance(bias, numbers.Real) or not (-MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS):
            raise ValueError(f"logit_bias[{token}] must be a number in [-100, 100], got {bias!r}")
        out[token] = float(bias)
    return tuple(sorted(out.items()))




@dataclass(frozen=True)
class ProcessorRows:
    """Each row's processor parameters (a row at the off values is untouched).

    repetition  [B] float   1 = off
    frequency   [B] float   0 = off
    presence    [B] float   0 = off
    min_tokens  [B] long    0 = off
    stop_ids    [B, E] long the ids `min_tokens` masks (EOS and stop token ids), -1 = padding
    bias        [B, V] float or None (no row has one): logit_bias, and -inf outside `allowed_token_ids`
    ngram       [B] long or None: no_repeat_ngram_size (0 = off; `ngram_bans`, the caller's, since it reads the text)
    words       [B, S, M] long or None: bad words as token sequences, -1 = padding (`word_bans`, likewise)
    """

    repetition: torch.Tensor
    frequency: torch.Tensor
    presence: torch.Tensor
    min_tokens: torch.Tensor
    stop_ids: torch.Tensor
    bias: torch.Tensor | None = None
    ngram: torch.Tensor | None = None
    words: torch.Tensor | None = None

    @classmethod
    def uniform(cls, batch: int, vocab: int, device, *, repetition: float = 1.0, frequency: float = 0.0,
                presence: float = 0.0, min_tokens: int = 0, stop_ids: Sequence[int] = (),
                logit_bias: Sequence[tuple[int, float]] = (), allowed: Sequence[int] | None = None,
                ngram: int = 0, bad_words: Sequence[Sequence[int]] = ()) -> "ProcessorRows":
        """The same parameters for every row of a batch of `batch` (the transformers loop: one request's
        parameters for all its prompts)."""
        def full(value, dtype):
            return torch.full((batch,), value, dtype=dtype, device=device)

        stops = torch.tensor([list(stop_ids) or [-1]] * batch, dtype=torch.long, device=device)
        bias = None
        if logit_bias or allowed is not None:
            bias = bias_row(vocab, logit_bias, allowed).to(device)[None, :].expand(batch, -1)
        words = words_tensor([bad_words] * batch, device) if bad_words else None
        return cls(full(repetition, torch.float32), full(frequency, torch.float32), full(presence, torch.float32),
                   full(min_tokens, torch.long), stops, bias, full(ngram, torch.long) if ngram else None, words)

    def select(self, index: torch.Tensor) -> "ProcessorRows":
        """Rows `index [B']` only (the loop drops finished rows)."""
        return ProcessorRows(self.repetition[index], self.frequency[index], self.presence[index],
                             self.min_tokens[index], self.stop_ids[index],
                             None if self.bias is None else self.bias[index],
                             None if self.ngram is None else self.ngram[index],
                             None if self.words is None else self.words[index])


def bias_row(vocab: int, logit_bias: Sequence[tuple[int, float]] = (),
             allowed: Sequence[int] | None = None) -> torch.Tensor:
    """One row's additive bias `[V]` (float32, host): logit_bias's values, -inf outside `allowed` (None = all)."""
    bias = torch.zeros(vocab, dtype=torch.float32)
    for token, value in logit_bias:
        bias[token] += value
    if allowed is not None:
        keep = torch.zeros(vocab, dtype=torch.bool)
        keep[torch.as_tensor(list(allowed), dtype=torch.long)] = True
        bias.masked_fill_(~keep, _NEG_INF)
    return bias


@dataclass(frozen=True)
class TokenHistory:
    """What the processors read of a row's committed text.

    prompt_seen  [B, V] bool    the token occurs in the prompt (the repetition penalty's prompt part)
    counts       [B, V] float32 occurrences of the token in the output (generated tokens)
    generated    [B] long       tokens generated so far
    """

    prompt_seen: torch.Tensor
    counts: torch.Tensor
    generated: torch.Tensor

    def select(self, index: torch.Tensor) -> "TokenHistory":
        return TokenHistory(self.prompt_seen[index], self.counts[index], self.generated[index])


def history_of(prompts: Sequence[Sequence[int]], vocab: int, device) -> TokenHistory:
    """The history of freshly admitted rows: their prompts, nothing generated."""
    seen = torch.zeros(len(prompts), vocab, dtype=torch.bool)
    for b, prompt in enumerate(prompts):
        seen[b, torch.as_tensor(list(prompt), dtype=torch.long)] = True
    batch = len(prompts)
    return TokenHistory(seen.to(device), torch.zeros(batch, vocab, dtype=torch.float32, device=device),
                        torch.zeros(batch, dtype=torch.long, device=device))


def advance(history: TokenHistory, tokens: torch.Tensor, counts: torch.Tensor | None = None) -> TokenHistory:
    """The history after appending the first `counts[b]` (None = all) of `tokens [B, k]` to row b's output."""
    keep = torch.ones_like(tokens, dtype=torch.float32) if counts is None else \
        (torch.arange(tokens.shape[1], device=tokens.device)[None, :] < counts[:, None]).float()
    added = torch.zeros_like(history.counts).scatter_add_(1, tokens.long(), keep)
    return TokenHistory(history.prompt_seen, history.counts + added, history.generated + keep.sum(1).long())


def _apply(logits: torch.Tensor, seen: torch.Tensor, counts: torch.Tensor, generated: torch.Tensor,
           is_stop: torch.Tensor, rows: ProcessorRows, bias: torch.Tensor | None) -> torch.Tensor:
    """The processors on logits `[B, k, C]` given, per entry, broadcastable to it: seen (prompt or output,
    bool), counts (output occurrences), generated tokens before the position ([B, k, 1]), is_stop (bool) and
    bias (or None). The one formula both the whole block and the draft columns go through."""
    out = logits.float()
    if bias is not None:
        out = out + bias
    too_early = generated < rows.min_tokens[:, None, None]
    out = out.masked_fill(too_early & is_stop, _NEG_INF)
    r = rows.repetition[:, None, None]
    penalized = torch.where(out > 0, out / r, out * r)
    out = torch.where(seen | (counts > 0), penalized, out)
    return out - rows.frequency[:, None, None] * counts - rows.presence[:, None, None] * (counts > 0).float()


def _stop_mask(stop_ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """[B, V] bool from stop ids `[B, E]` (-1 = padding)."""
    index = torch.where(stop_ids >= 0, stop_ids, torch.full_like(stop_ids, vocab))
    mask = torch.zeros(stop_ids.shape[0], vocab + 1, dtype=torch.bool, device=stop_ids.device)
    return mask.scatter_(1, index, True)[:, :vocab]


def process_draft(logits: torch.Tensor, draft: torch.Tensor, rows: ProcessorRows, history: TokenHistory,
                  allowed: torch.Tensor | None = None, banned: torch.Tensor | None = None) -> torch.Tensor:
    """Processed logits `[B, γ+1, V]` (float32) for positions 1..γ+1 of a step.

    logits  [B, γ+1, V]  raw scores at positions 1..γ+1 (position i follows the committed text + x_1..x_{i-1})
    draft   [B, γ]       x_1..x_γ (entries past a row's draft length are never read by verify: any id in [0, V))
    history              the committed text's `TokenHistory`
    allowed [B, γ+1, V] bool or None: a host constraint's allowed tokens (`constraint_masks`)
    banned  [B, γ+1, V] bool or None: tokens banned by the text (`ngram_bans`)

    Position i sees the history advanced by x_1..x_{i-1}: the same value as `process_draft(logits[:, i:i+1],
    draft[:, :0], rows, advance(history, draft[:, :i]))`. No host synchronization (graph-safe).
    """
    batch, width, vocab = logits.shape
    gamma = draft.shape[1]
    if width != gamma + 1:
        raise ValueError(f"process_draft: logits {tuple(logits.shape)} need γ+1 = {gamma + 1} positions for "
                         f"draft {tuple(draft.shape)}")
    generated = history.generated[:, None, None] + torch.arange(width, device=logits.device)[None, :, None]
    is_stop = _stop_mask(rows.stop_ids, vocab)
    seen = history.prompt_seen[:, None, :]
    counts = history.counts[:, None, :]
    bias = None if rows.bias is None else rows.bias[:, None, :]
    out = _apply(logits, seen, counts, generated, is_stop[:, None, :], rows, bias)
    if gamma:
        # the drafted columns: at position i token x_j has been drafted #{j' < i: x_j' = x_j} more times
        draft = draft.long()
        same = (draft[:, :, None] == draft[:, None, :]).float()  # [B, γ(j), γ(j')]
        before = torch.cat([same.new_zeros(batch, gamma, 1), same.cumsum(2)], 2)  # [B, γ(j), γ+1(i)]: j' < i
        extra = before.transpose(1, 2)  # [B, γ+1(i), γ(j)]
        cols = draft[:, None, :].expand(batch, width, gamma)
        col_counts = history.counts.gather(1, draft)[:, None, :] + extra
        col_seen = history.prompt_seen.gather(1, draft)[:, None, :]
        col_bias = None if rows.bias is None else rows.bias.gather(1, draft)[:, None, :]
        fixed = _apply(logits.gather(2, cols), col_seen, col_counts, generated, is_stop.gather(1, draft)[:, None, :],
                       rows, col_bias)
        out = out.scatter(2, cols, fixed)  # a token drafted twice gets the same value from both columns
    if allowed is not None:
        out = out.masked_fill(~allowed, _NEG_INF)
    if banned is not None:
        out = out.masked_fill(banned, _NEG_INF)
    return out


@runtime_checkable
class TokenConstraint(Protocol):
    """One row's host-side processor state (a grammar matcher), driven by the runners:

    - `allowed(draft)` before verifying a step: bool `[len(draft) + 1, V]` (on any device; the runner moves it),
      row i the tokens allowed after the committed text followed by draft[:i]. It must leave the committed
      state as it found it (advance a matcher along the draft, fill the masks, roll the matcher back). Rows
      after the first draft token the constraint itself disallows are never read: return anything with at least
      one True there (e.g. all True). Every row must allow at least one token (a finished grammar allows EOS).
      The transformers loop's model drafter also calls it with its own growing prefix (one row per call read:
      the last), so q is masked too and disallowed tokens are not drafted.
    - `commit(tokens)` after the step: the tokens the row committed (accepted drafts and the next token, EOS
      included; cut at the budget). The rejected drafts are never committed: that is the rollback.

    The runners never call it concurrently; one object per row (`ConstraintSpec.start`).
    """

    def allowed(self, draft: Sequence[int]) -> torch.Tensor: ...

    def commit(self, tokens: Sequence[int]) -> None: ...


@runtime_checkable
class ConstraintSpec(Protocol):
    """What `SamplingParams.constraint` holds: an immutable description (a compiled grammar) that starts one
    `TokenConstraint` per row. `start(vocab_size)` is called when the row starts generating (after the prompt)."""

    def start(self, vocab_size: int) -> TokenConstraint: ...


def constraint_masks(constraints: Sequence[TokenConstraint | None], draft: torch.Tensor, vocab: int,
                     device) -> torch.Tensor:
    """Allowed tokens `[B, γ+1, V]` bool for every row (rows without a constraint: all True), from the draft
    `[B, γ]` (read on the host: a synchronization)."""
    gamma = draft.shape[1]
    drafts = draft.tolist()
    out = torch.ones(len(constraints), gamma + 1, vocab, dtype=torch.bool)
    for b, constraint in enumerate(constraints):
        if constraint is None:
            continue
        mask = constraint.allowed(drafts[b]).to("cpu", torch.bool)
        if mask.dim() != 2 or mask.shape[0] != gamma + 1 or mask.shape[1] > vocab:
            raise ValueError(f"constraint {type(constraint).__name__}.allowed returned {tuple(mask.shape)}; expected "
                             f"bool [{gamma + 1}, <= {vocab}]")
        out[b, :, : mask.shape[1]] = mask
        out[b, :, mask.shape[1]:] = False
    return out.to(device)
