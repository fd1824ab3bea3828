"""Token ids → text, one token at a time: every piece is valid UTF-8 and the pieces concatenate to the text.

`IncrementalText` feeds each token to tokenizers' `DecodeStream` (which holds a token back while it ends in
an incomplete UTF-8 sequence) and applies stop strings: text that could be the start of a stop string is
held back until it is known not to be one; when a stop string appears, the text is cut before it.
"""

from __future__ import annotations

__all__ = ["IncrementalText", "backend_tokenizer", "MAX_STOP_STRINGS", "MAX_STOP_LENGTH"]

MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256
# Prompt tokens given to the decoder as context, so the first generated token decodes as it would in context
# (a Metaspace tokenizer would otherwise drop a leading space).
_CONTEXT_TOKENS = 6


def backend_tokenizer(tokenizer):
    """The `tokenizers.Tokenizer` behind a transformers tokenizer (None for a slow, Python-only one)."""
    from tokenizers import Tokenizer

    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
    return backend if isinstance(backend, Tokenizer) else None


class _DiffDecoder:
    """The same contract as `DecodeStream.step` for tokenizers without a Rust backend (re-decodes a short window)."""

    def __init__(self, tokenizer, context: list[int]):
        self.tokenizer = tokenizer
        self.ids = list(context)
        self.prefix = 0
        self.read = len(self.ids)

    def _decode(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def step(self, token_id: int) -> str | None:
        self.ids.append(token_id)
        before = self._decode(self.ids[self.prefix : self.read])
        after = self._decode(self.ids[self.prefix :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return after[len(before) :]
        return None


class IncrementalText:
    """The text of one request, built token by token.

    `add(token_id)` returns the text released by this token ("" while held back); `finish()` releases the
    rest. After a stop string, `stopped` is True and further tokens are ignored. Before `min_tokens` tokens, stop
    strings are not looked for (vLLM's `min_tokens`: nothing stops the text before then).
    """

    def __init__(self, tokenizer, prompt_ids: list[int], stop: tuple[str, ...] = (), min_tokens: int = 0):
        self._tokenizer = tokenizer
        self._backend = backend_tokenizer(tokenizer)
        context = list(prompt_ids[-_CONTEXT_TOKENS:])
        if self._backend is not None:
            from tokenizers.decoders import DecodeStream

            self._stream = DecodeStream(ids=context, skip_special_tokens=True)
        else:
            self._stream = _DiffDecoder(tokenizer, context)
        self.stop = tuple(stop)
        self.min_tokens = min_tokens
        self._longest_stop = max((len(s) for s in self.stop), default=0)
        self._text = ""  # decoded so far (may run past a stop string until cut)
        self._released = 0  # characters of _text handed out
        self._pending: list[int] = []  # tokens the decoder holds (incomplete UTF-8)
        self.token_ids: list[int] = []
        self.stopped = False
        self.stop_string: str | None = None

    @property
    def text(self) -> str:
        """The text released so far (after `finish()`: the final text)."""
        return self._text[: self._released]

    def add(self, token_id: int) -> str:
        if self.stopped:
            return ""
        self.token_ids.append(token_id)
        if self._backend is not None:
            piece = self._stream.step(self._backend, token_id)
        else:
            piece = self._stream.step(token_id)
        if piece is None:
            self._pending.append(token_id)
            return ""
        self._pending.clear()
        self._text += piece
        return self._release(final=False)

    def finish(self) -> str:
        """Release everything left: tokens whose bytes never formed a complete character decode with U+FFFD."""
        if not self.stopped and self._pending:
            self._text += self._tokenizer_decode(self._pending)
            self._pending.clear()
        return self._release(final=True)

    def _tokenizer_decode(self, ids: list[int]) -> str:
        if self._backend is not None:
            return self._backend.decode(ids, skip_special_tokens=True)
        return self._tokenizer.decode(ids, skip_special_tokens=True)

    def _release(self, final: bool) -> str:
        start = self._released
        if self.stopped:
            return ""
        end = len(self._text)
        if self.stop and len(self.token_ids) >= self.min_tokens:
            # A stop string cannot begin inside released text: released text never ends in a stop prefix.
            found = [(i, s) for s in self.stop if (i := self._text.find(s, start)) >= 0]
            if found:
                cut, self.stop_string = min(found)
                self._text = self._text[:cut]
                self.stopped = True
                self._released = cut
                return self._text[start:cut]
            if not final:
                end -= self._held_back(start)
        self._released = end
        return self._text[start:end]

    def _held_back(self, start: int) -> int:
        """Length of the longest unreleased suffix that is a proper prefix of some stop string."""
        tail = self._text[max(start, len(self._text) - self._longest_stop + 1) :]
        for k in range(len(tail), 0, -1):
            suffix = tail[-k:]
            if any(s.startswith(suffix) for s in self.stop):
                return k
        return 0
