"""Prefix caching on the paged KV pool (`EngineConfig.enable_prefix_caching`: on by default with kv_layout="paged").

A full block of a request's committed text is named by a hash chain: hash(parent's hash, the block's tokens, extra
keys), the chain seeded by the engine's model key (target and drafter identity, dtype), so equal hashes mean equal
text from position 0 under the same models, and nothing cached survives a change of model. Terms (vLLM's):

  cached block   a block whose hash is in the index: its K/V (every model's: `PagedSlotCache` keeps the target's
                 and a cached drafter's in the same block) hold exactly that text. It stays cached after its
                 request leaves (reference count 0, on the allocator's cached free list) until the allocator hands
                 it out again: only when no other block is free, and in order of release, so the least recently
                 used goes first (`BlockAllocator.evict` calls `evict` here before a cached block is reused)
  hit            admission finds the longest run of a prompt's leading blocks in the index; the row's table starts
                 with them (`KVPool.share_row`: counts up, free ones taken off the free list) and the target's
                 prefill and the drafter's feed start past them (`EngineRequest.num_cached_tokens`)

Never written when shared: a hit stops before the target's first write (its first step writes at prompt length
− 1, so the last prompt token is always recomputed: it has logits); the hit blocks a model drafter's re-feed
writes (from length − `WINDOW`) are copied into blocks of the row's own, every model's K/V (copy-on-write), or,
held by nobody, taken over by the row (out of the index until stable again). So no block a request shares is
ever written. Only committed text makes a block eligible, and only once every model's K/V hold it (`stable`): the
target holds [0, length − 1), the drafter [0, its valid length) and writes nothing below length − WINDOW again,
so rejected drafts (written past the committed length) never enter the cache. Prompt blocks are entered every
step (`commit_rows`, host lists only), generated ones too — the host keeps each request's committed tokens
(`extend`, from the step's record) — so a block is shareable from the step its models hold it, while its request
runs: concurrent requests with one system prompt, and `n > 1` copies of a prompt, share it. What that costs a step
when nothing is shared: `extend` appends each row's tokens and notes the rows whose length reached `due` (the
length below which their next block cannot be stable); `commit_rows` reads only those, the rows joined since, or
every row after a release moved one; each new block's text is read once (its hash and its entry, bytes).
Checks (`verify`, `watch_weights`): a hit compares each cached block's stored (parent hash, tokens) with the
prompt's, so a hash collision is refused (`collisions`), never served; the models' weights (the engine shares the
user's) are sampled before a hit (at most once a step, and only when a prompt's first block is cached: a prompt
that shares nothing costs no read of them), and changed in place — an adapter merged, a state dict
loaded — the index is cleared (`reset`, vLLM's reset_prefix_cache) and blocks admitted under the old weights
never enter: nothing cached survives a change of weights (another model is another engine, another pool).
Feature drafters: the target's stored features live in the pool's blocks too (`features.FeatureStore`), so a
hit holds them, and a feature head's own K/V with them; a head re-feeds a window before each feed (`refeed`), so
its hit blocks in that window are copied, and its entries count as stable only below that window.
"""

from __future__ import annotations

import hashlib
import logging
from array import array
from dataclasses import dataclass, field

import torch


__all__ = ["PrefixCache", "RequestBlocks", "block_hashes", "model_key"]

logger = logging.getLogger(__name__)

def model_key(*parts) -> bytes:
    """The seed of every hash chain: a digest of what besides the text changes K/V (models, dtypes, adapters)."""
    return hashlib.sha256(repr(parts).encode()).digest()


def block_hashes(tokens: list[int], block_size: int, seed: bytes, parents: list[bytes] | None = None,
                 extra: bytes = b"", stop: int | None = None) -> list[bytes]:
    """The hash chain of `tokens`' full blocks (of its first `stop` tokens: None = all): block i's hash is
    sha256(block i−1's hash (block 0: `seed`), its tokens (8 bytes each), `extra`) (`_digest` of `_block_data`).
    parents: the hashes of the leading blocks already known (extended, not recomputed: a block is hashed once)."""
    hashes = list(parents or [])
    end = len(tokens) if stop is None else min(stop, len(tokens))
    parent = hashes[-1] if hashes else seed
    for start in range(len(hashes) * block_size, end - block_size + 1, block_size):
        parent = _digest(parent, _block_data(tokens, start, block_size, extra))
        hashes.append(parent)
    return hashes


def _block_data(tokens: list[int], start: int, block_size: int, extra: bytes = b"") -> bytes:
    """What names a block besides its parent: its tokens (8 bytes each), then `extra`."""
    return array("q", tokens[start : start + block_size]).tobytes() + b"|" + extra


def _digest(parent: bytes, data: bytes) -> bytes:
    """A block's hash: sha256 of its parent's hash and its `_block_data`."""
    return hashlib.sha256(parent + data).digest()


@dataclass
class RequestBlocks:
    """One request's side of the cache: its committed text as the host knows it (the prompt, then each step's
    committed tokens: never a rejected draft), its blocks' hash chain as far as known, and how many leading blocks
    of its row are in the index (hit at admission, or entered since)."""

    hashes: list[bytes] = field(default_factory=list)
    num_cached_blocks: int = 0
    tokens: list[int] = field(default_factory=list)
    epoch: int = 0  # the cache's epoch at its admission: blocks of an older one (other weights) never enter
    # the committed length below which its next block cannot be stable (`PrefixCache.due`): a step's rows shorter
    # than this are not looked at (0: look)
    due: int = 0


class PrefixCache:
    """The cached-block index of one `KVPool` (hash → block and back) and its lookups' counters."""

    def __init__(self, pool, seed: bytes, write_back: int, caches: tuple = (), refeed: int = 0, models: tuple = ()):
        self.pool, self.seed, self.caches = pool, seed, tuple(caches)  # caches: every model's `PagedSlotCache`
        self.block_size = pool.block_size  # (and the stored features' blocks: `FeatureBlocks`)
        self.write_back = int(write_back)  # a request writes no position below its length − write_back
        # a drafter's feed from position s rewrites [s − refeed, s) too, and its valid count may include that many
        # entries drafted from predicted features (a feature head's window: `EngineFeatureDrafter.prefill`)
        self.refeed = int(refeed)
        # checks: each cached block's (parent hash, tokens), compared at every hit (a hash collision is no hit), and
        # the weights of `models` (modules whose K/V or features the blocks hold; the engine shares the user's
        # weights): changed in place — an adapter merged, a state dict loaded — the index is cleared (`reset`)
        # before the next hit. Weights are compared by a strided sample of each tensor (~64 entries), once a step
        self.verify = True
        self.watch_weights = True
        self._entries: dict[int, bytes] = {}  # block → its parent's hash + its `_block_data` (bytes: no GC work)
        self.models = tuple(m for m in models if isinstance(m, torch.nn.Module))
        self._samples = [(t, torch.arange(0, t.numel(), max(1, t.numel() // 64) | 1, device=t.device))
                         for m in self.models for t in m.state_dict(keep_vars=True).values()
                         if t.numel() and not t.is_meta]  # (meta: a weight held elsewhere, e.g. kept quantized)
        self._weights = self._fingerprint()
        self._weights_checked = False  # since the last step (`commit_rows`)
        self.epoch = 0
        self.collisions = 0  # lookups whose hash matched a block of other text (refused)
        self.resets = 0  # index cleared because the models' weights changed
        self._blocks: dict[bytes, int] = {}
        self._hashes: dict[int, bytes] = {}
        self.queries = 0  # prompt tokens looked up (vLLM's prefix_cache_queries)
        self.hits = 0  # of those, found cached (vLLM's prefix_cache_hits)
        self.evictions = 0  # cached blocks handed out for other K/V
        self.copies = 0  # hit blocks copied for a request that writes them (copy-on-write)
        self.held = False  # `pending` held a request back for blocks an admission is about to prefill
        # what `commit_rows` looks at (a step's host work must not grow with the rows that have nothing to enter):
        # the slots `extend` found due at the end of the last step, the rows past the `_known` it covered (joined
        # since), or every row after a release reordered the slots (`_scan`, set by `commit_row`)
        self._due: list[int] = []
        self._known = 0
        self._scan = True
        self._admitted: tuple = (None, 0, set())  # `pending`'s admission round: (its list, requests seen, first blocks)
        pool.allocator.evict = self.evict
        pool.allocator.cached = self._hashes.__contains__  # (a freed block it names waits on the cached free list)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._blocks)

    def evict(self, blocks: list[int]) -> None:
        """These blocks are handed out for new K/V: they leave the index (the allocator's hook)."""
        for b in blocks:
            self.evictions += self._drop(b)

    def _drop(self, block: int) -> bool:
        h = self._hashes.pop(block, None)
        if h is not None:
            del self._blocks[h]
            del self._entries[block]
        return h is not None

    def _fingerprint(self) -> torch.Tensor | None:
        """The watched weights' strided samples, as float64 `[n]` (None: nothing watched)."""
        if not self._samples:
            return None
        groups: dict = {}  # (per device: one copy to the host each)
        with torch.no_grad():
            for t, i in self._samples:
                groups.setdefault(t.device, []).append(t.detach().reshape(-1)[i].to(torch.float64))
            return torch.cat([torch.cat(parts).cpu() for parts in groups.values()])

    def reset(self, why: str = "reset") -> None:
        """Forget every cached block (they stay where they are: held ones with their requests, free ones free);
        running requests' blocks never enter again (a new epoch). vLLM's reset_prefix_cache."""
        if self._blocks:
            logger.info("prefix cache cleared (%d blocks): %s", len(self._blocks), why)
        self._blocks.clear()
        self._hashes.clear()
        self._entries.clear()
        self.pool.allocator.uncache()
        self.epoch += 1
        self.resets += 1

    def _check_weights(self) -> None:
        """Before a possible hit, once a step: the watched weights' sample unchanged, or the index cleared."""
        if not self._samples or self._weights_checked or not self.watch_weights:
            return
        self._weights_checked = True
        state = self._fingerprint()
        if state is not None and not torch.equal(state, self._weights):
            self._weights = state
            self.reset("the models' weights changed")

    def attach(self, slot: int, request) -> int:
        """Admission of `request` (an `EngineRequest`) into `slot`, which holds no blocks: its prompt's longest
        cached leading run of blocks becomes the row's first blocks → the cached tokens (also set on the request)."""
        prompt, allocator, size = request.prompt, self.pool.allocator, self.block_size
        hashes = block_hashes(prompt, size, self.seed)
        if hashes and hashes[0] in self._blocks:  # (a hit is possible: only then the weights' sample is read)
            self._check_weights()
        state = RequestBlocks(hashes, tokens=list(prompt), epoch=self.epoch)  # (due 0: its first step looks)
        usable = max(len(prompt) - 1, 0) // self.block_size  # the target's first write: prompt length − 1
        shareable = max(len(prompt) - self.write_back, 0) // self.block_size  # and a model drafter's re-feed
        blocks = []
        for i, h in enumerate(state.hashes[:usable]):
            b = self._blocks.get(h)
            if b is None:
                break
            if self.verify and self._entries[b] != (state.hashes[i - 1] if i else self.seed) + _block_data(
                    prompt, i * size, size):
                self.collisions += 1  # the hash named another text: not a hit
                break
            blocks.append(b)
        # a feature head's feed from the hit re-feeds its window before it: those blocks are written too (and its
        # entry at a block's last position reads the next block's first token, which only a hit past it matched)
        shareable = min(shareable, max(len(blocks) * self.block_size - self.refeed, 0) // self.block_size)
        owned = []  # hits the drafter's re-feed will write: copy-on-write, or taken over when nobody holds them
        for b in blocks[shareable:]:
            if allocator.ref_count(b) == 0:
                allocator.touch([b])
                self._drop(b)
                owned.append(b)
            else:
                copy = allocator.allocate(1)[0]  # (admission counted a fresh block for every prompt block)
                for cache in self.caches:
                    cache.copy_block(b, copy)
                owned.append(copy)
                self.copies += 1
        if blocks:
            self.pool.share_row(slot, blocks[:shareable], owned)
        state.num_cached_blocks = min(len(blocks), shareable)  # (the owned ones enter again once stable)
        state.due = self.due(state)
        request.prefix = state
        request.num_cached_tokens = cached = len(blocks) * self.block_size
        self.queries += len(prompt)
        self.hits += cached
        return cached

    def pending(self, request, admitted: list) -> bool:
        """Whether `request` would hit blocks that one of `admitted` (admitted with it, not prefilled yet) is about
        to enter: its first block is theirs and not cached (`n > 1` copies of a prompt: one prefills, then the
        others are admitted and hit — in the same step, `take_held`). Sets `held` when so."""
        size, back = self.block_size, self.write_back
        if not admitted or len(request.prompt) - back < size:
            return False
        if admitted is not self._admitted[0]:  # (one admission round grows one list: its first blocks kept as a
            self._admitted = (admitted, 0, set())  # set, each admitted request's taken once — not a scan a call)
        _, seen, firsts = self._admitted
        for a in admitted[seen:]:
            if len(a.prompt) - back >= size:
                firsts.add(tuple(a.prompt[:size]))
        self._admitted = (admitted, len(admitted), firsts)
        first = request.prompt[:size]
        if tuple(first) not in firsts:
            return False
        held = block_hashes(first, size, self.seed)[0] not in self._blocks
        self.held = self.held or held
        return held

    def take_held(self, running, drafter_synced: bool | None) -> bool:
        """After an admission's prefill: whether `pending` held a request back for the blocks just prefilled, and
        those blocks are cached now (`commit_rows` first) — then the engine admits again in the same step, and the
        held copies hit: `n > 1` choices share the prompt's blocks from their first step (the hit's copy-on-write
        of a drafter's re-fed window reads the K/V the prefill just wrote). False when the drafter was not fed (a
        run of plain steps): nothing is stable yet, and they wait a step as before."""
        if not self.held:
            return False
        self.held = False
        before = len(self._blocks)
        self.commit_rows(running, drafter_synced)
        return len(self._blocks) > before

    def stable(self, request, drafter_valid: int | None, leaving: bool = False) -> int:
        """Positions [0, stable) of a running request that every model's K/V hold and it never writes again
        (`leaving`: it writes nothing more, so all the target holds, [0, length − 1), and the drafter's)."""
        end = request.length - (1 if leaving else max(self.write_back, 1))
        return end if drafter_valid is None else min(end, drafter_valid - self.refeed)

    def commit(self, slot: int, request, tokens: list[int], stable: int) -> None:
        """Enter the request's full blocks below `stable` (its committed `tokens` cover them) into the index."""
        state: RequestBlocks | None = request.prefix
        if state is None:
            return
        blocks = self.pool.blocks[slot]
        full = min(stable, len(tokens)) // self.block_size
        if full <= state.num_cached_blocks:
            return
        # (no weight check here, only before a hit — `attach`: blocks entered after a change of weights are
        # cleared by the check that precedes the next hit, before any request can read them; checking on every
        # entry gathered a sample of every weight tensor and synchronized the device about once a step)
        if state.epoch != self.epoch:  # (admitted under other weights: its K/V never enter)
            state.due = _NEVER
            return
        size, hashes, index = self.block_size, state.hashes, self._blocks
        for i in range(state.num_cached_blocks, full):  # (each new block's text read once: hashed, and its entry)
            parent = hashes[i - 1] if i else self.seed
            data = _block_data(tokens, i * size, size)
            if i == len(hashes):  # (its hash not known yet: a generated block's, or a prompt's past the hits)
                hashes.append(_digest(parent, data))
            h, b = hashes[i], blocks[i]
            if h not in index and b not in self._hashes:  # (another request's copy may be cached already)
                index[h], self._hashes[b] = b, h
                self._entries[b] = parent + data
        state.num_cached_blocks = full
        state.due = self.due(state)

    def due(self, state: RequestBlocks) -> int:
        """The committed length a request must reach before its next block can be stable: every model holds it and
        it is never written again needs length − max(write_back, 1) ≥ its end (`stable` is at most that)."""
        return (state.num_cached_blocks + 1) * self.block_size + max(self.write_back, 1)

    def extend(self, running, tokens) -> None:
        """After a step: each running request's committed tokens (`StepRecord.tokens`, row i = slot i) join the text
        its blocks are named by (host lists; only committed tokens, so a rejected draft never names a block), and
        the slots whose length reached their `due` are noted for the next `commit_rows` (only those are looked at:
        a row between block boundaries costs the step one comparison)."""
        due = []
        for slot, (request, t) in enumerate(zip(running, tokens)):
            state = request.prefix
            if state is not None:
                state.tokens += t
                if request.length >= state.due:
                    due.append(slot)
        self._due, self._known = due, len(running)

    def commit_rows(self, running, drafter_synced: bool | None) -> None:
        """Each step: the running requests' full blocks of committed text — prompt and generated alike — that
        became stable enter the index while they run (drafter_synced: the engine's `_drafter_synced` — True: every
        row's drafter holds all but its last 2 tokens, False: its `draft_valid`; None: no cached drafter)."""
        size, self._weights_checked, self.held = self.block_size, False, False  # (a step's flags)
        if self._scan or self._known > len(running):  # (a release moved rows since `extend`: every row)
            slots = range(len(running))
        else:  # the slots `extend` found due, and the rows that joined since (their prompts' blocks)
            slots = self._due + list(range(self._known, len(running)))
        self._due, self._known, self._scan = [], len(running), False
        for slot in slots:
            request = running[slot]
            state = request.prefix
            if state is None or request.length < state.due or (state.num_cached_blocks + 1) * size > len(state.tokens):
                continue
            stable = self.stable(request, _valid(request, drafter_synced))
            if stable // size > state.num_cached_blocks:
                self.commit(slot, request, state.tokens, stable)

    def commit_row(self, slot: int, request, state_tokens, drafter_synced: bool | None) -> None:
        """A running request leaves `slot`: its stable blocks, generated ones included, stay cached (its host text;
        `state_tokens`, the slot state's token table, is read only if that text were short of its length)."""
        self._scan = True  # (the last running row moves into `slot`: `extend`'s due slots are stale)
        state = request.prefix
        stable = self.stable(request, _valid(request, drafter_synced), leaving=True)
        if state is None or stable // self.block_size <= state.num_cached_blocks:
            return
        tokens = state.tokens if len(state.tokens) >= request.length else state_tokens[slot, : request.length].tolist()
        self.commit(slot, request, tokens, stable)

    def check(self) -> None:
        """The index and its reverse agree, and every cached block is a real block (not the null block)."""
        if len(self._blocks) != len(self._hashes) or any(self._hashes.get(b) != h for h, b in self._blocks.items()):
            raise AssertionError("the prefix cache's index and its reverse disagree")
        if 0 in self._hashes:
            raise AssertionError("the null block is cached")
        if self._entries.keys() != self._hashes.keys():
            raise AssertionError("the prefix cache's entries and its index disagree")


_NEVER = 1 << 62  # a `due` no length reaches (a request admitted under other weights: nothing of it enters)


def _valid(request, drafter_synced: bool | None) -> int | None:
    if drafter_synced is None:
        return None
    return request.length - 2 if drafter_synced else request.draft_valid
