"""`stop_strings` of `specdec.generate` at the ids level: `StopCut` decodes each row's text as its tokens arrive and
ends the row after the first token whose text completes a stop string (kept, as transformers keeps it)."""

from __future__ import annotations

from specdec.step import TokenEvent

__all__ = ["StopCut"]


class StopCut:
    """`stop_strings` at the ids level: each row's text decoded as its tokens arrive; a row ends after the first
    token whose text completes a stop string (kept in the output, as transformers keeps it)."""

    def __init__(self, stops: tuple[str, ...], tokenizer, rows: int):
        self.stops, self.tokenizer = stops, tokenizer
        self.tokens: list[list[int]] = [[] for _ in range(rows)]
        self.ends: list[int | None] = [None] * rows  # tokens kept per row once it met a stop string

    @staticmethod
    def check(stop_strings, tokenizer) -> tuple[str, ...]:
        """The stop strings as a tuple (() for None), refused in one line when malformed or without a tokenizer."""
        if stop_strings is None:
            return ()
        stops = (stop_strings,) if isinstance(stop_strings, str) else stop_strings
        if not isinstance(stops, (list, tuple)) or not stops or not all(isinstance(x, str) and x for x in stops):
            raise TypeError(f"stop_strings must be a non-empty string or list of them, got {stop_strings!r:.80}")
        if not callable(getattr(tokenizer, "decode", None)):
            raise ValueError("stop_strings needs tokenizer= (the target's tokenizer), as in transformers")
        return tuple(stops)

    def _hit(self, tokens: list[int]) -> bool:
        text = self.tokenizer.decode(tokens)
        return any(stop in text for stop in self.stops)

    def feed(self, event: TokenEvent) -> TokenEvent:
        """Record a step's tokens; the same event restricted to what is shown (nothing past a row's stop)."""
        rows, shown = [], []
        for row, new in zip(event.rows, event.tokens):
            if self.ends[row] is not None:
                continue
            before = len(self.tokens[row])
            self.tokens[row].extend(new)
            if self._hit(self.tokens[row]):  # the first k whose text holds a stop (none did before this step)
                lo, hi = before + 1, len(self.tokens[row])
                while lo < hi:
                    mid = (lo + hi) // 2
                    lo, hi = (lo, mid) if self._hit(self.tokens[row][:mid]) else (mid + 1, hi)
                self.ends[row] = lo
                new = self.tokens[row][before:lo]
            rows.append(row)
            shown.append(list(new))
        return TokenEvent(event.step, rows, shown, event.finished, None)

    def cut(self, sequences: list[list[int]]) -> list[list[int]]:
        return [seq if end is None else seq[:end] for seq, end in zip(sequences, self.ends)]
