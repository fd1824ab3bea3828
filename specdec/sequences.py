"""The committed tokens of a batch of ragged sequences, right-padded in one preallocated tensor."""

from __future__ import annotations

import torch


class TokenBuffer:
    """Committed tokens per row: `tokens [B, capacity]` (row b valid in `[0, lengths[b])`).

    `start_lengths [B]` marks where generation began (the prompt for decoder-only targets, the decoder
    start token for encoder-decoder ones); `source` optionally keeps encoder inputs for drafters that
    copy from them.
    """

    def __init__(self, rows: list[list[int]], capacity: int, device: torch.device | str = "cpu"):
        batch = len(rows)
        longest = max((len(r) for r in rows), default=0)
        capacity = max(capacity, longest)
        self.tokens = torch.zeros(batch, capacity, dtype=torch.long)
        for b, row in enumerate(rows):
            self.tokens[b, : len(row)] = torch.as_tensor(row, dtype=torch.long)
        self.tokens = self.tokens.to(device)
        self.lengths = torch.tensor([len(r) for r in rows], dtype=torch.long, device=device)
        self.start_lengths = self.lengths.clone()
        self.source: list[list[int]] | None = None
        # The decoding loop never appends past prompt + max_new_tokens, reserves that capacity up front and
        # turns growth off, which saves a host sync per step.
        self.growable = True

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def capacity(self) -> int:
        return self.tokens.shape[1]

    def tail(self, width: int, counts: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The last `counts[b]` tokens of each row, right-aligned in `[B, width]`, and their validity mask.

        Slots left of a row's tokens (when counts[b] < width) are padding (token 0, valid False).
        """
        if counts is None:
            counts = torch.full_like(self.lengths, width)
        offsets = torch.arange(width, device=self.tokens.device)[None, :] - width  # -width .. -1
        index = self.lengths[:, None] + offsets
        valid = (offsets >= -counts[:, None]) & (index >= 0)
        tokens = self.tokens.gather(1, index.clamp_min(0)) * valid
        return tokens, valid

    def append(self, new_tokens: torch.Tensor, counts: torch.Tensor) -> None:
        """Append the first `counts[b]` of `new_tokens [B, k]` to row b."""
        if self.growable:
            needed = int((self.lengths + counts).max()) if self.batch_size else 0
            if needed > self.capacity:
                self.reserve(max(needed, 2 * self.capacity))
        write_tokens(self.tokens, self.lengths, new_tokens, counts)
        self.lengths = self.lengths + counts

    def reserve(self, capacity: int) -> None:
        """Make room for `capacity` tokens per row."""
        if capacity > self.capacity:
            grown = torch.zeros(self.batch_size, capacity, dtype=torch.long, device=self.tokens.device)
            grown[:, : self.capacity] = self.tokens
            self.tokens = grown

    def select_rows(self, index: torch.Tensor) -> None:
        self.tokens = self.tokens[index]
        self.lengths = self.lengths[index]
        self.start_lengths = self.start_lengths[index]
        if self.source is not None:
            self.source = [self.source[i] for i in index.tolist()]

    def row(self, b: int) -> list[int]:
        return self.tokens[b, : int(self.lengths[b])].tolist()


def write_tokens(tokens: torch.Tensor, lengths: torch.Tensor, new_tokens: torch.Tensor, counts: torch.Tensor) -> None:
    """Write the first `counts[b]` of `new_tokens [B, k]` into `tokens [B, capacity]` from column `lengths[b]`,
    in place, with no host sync (the engine's graphs call it too). Lengths are not moved. See `write_rows`."""
    write_rows(tokens, lengths, new_tokens, counts)


def write_rows(buffer: torch.Tensor, starts: torch.Tensor, new: torch.Tensor, counts: torch.Tensor) -> None:
    """Write the first `counts[b]` entries of `new [B, k, ...]` into `buffer [B, capacity, ...]` from column
    `starts[b]`, in place, with no host sync: committed tokens `[B, capacity]`, and the target's features
    `[B, capacity, dim]` for feature drafters, follow this one rule.

    Columns past the capacity are clamped to the last one (callers size the buffer so this never commits).
    Masked entries rewrite column `starts[b]` with the value it ends up holding anyway, so no two writes to a
    column disagree (scatter order does not matter).
    """
    k = new.shape[1]
    last = buffer.shape[1] - 1
    cols = torch.arange(k, device=buffer.device)[None, :]
    write = cols < counts[:, None]
    first = starts.clamp(max=last)[:, None]  # [B, 1]
    where = torch.where(write, (starts[:, None] + cols).clamp(max=last), first)  # [B, k]
    trailing = buffer.shape[2:]
    expand = (*where.shape, *trailing)
    index = where.view(*where.shape, *(1,) * len(trailing)).expand(expand)
    first_index = first.view(*first.shape, *(1,) * len(trailing)).expand(first.shape[0], 1, *trailing)
    new = new.to(buffer.dtype)
    fill = torch.where((counts[:, None] > 0).view(-1, 1, *(1,) * len(trailing)), new[:, :1],
                       buffer.gather(1, first_index))  # [B, 1, ...]: what column starts[b] will hold
    mask = write.view(*write.shape, *(1,) * len(trailing))
    buffer.scatter_(1, index, torch.where(mask, new, fill.expand(expand)))
