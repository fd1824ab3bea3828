"""Prepared data folders: what the CPU data-prep step writes and the (GPU) training step reads.

code folder (`prepare_code_data`):      ende folder (`prepare_ende_data`):
    tokenizer/      shared BPE               tokenizer/        shared BPE (appends </s>)
    train.bin.gz    uint16 token stream      train.jsonl.gz    {"en", "de", "source"} per line
    val.bin.gz      uint16 token stream      val.jsonl.gz      in-domain test pairs
    meta.json       sources, counts          ood.jsonl.gz      out-of-domain test pairs (whole catalogs)
                                             meta.json

Token streams are documents joined with `</s>` after each one. gzip keeps a 40M-token stream near
30 MB, so the folder can travel to a machine that lacks the source files.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from specdec.zoo.corpus import OOD_DOMAINS, EmptyCorpusError, code_documents, ende_pairs, python_source_roots
from specdec.zoo.tokenizer import EOS, load_tokenizer, train_bpe_tokenizer

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
BUCKET_BATCHES = 32  # PairData.train_batch sorts this many batches' worth of pairs by length at a time
PAD_MULTIPLE = 2  # PairData.token_batch pads each length up to a multiple of this


def _progress(iterable, total: int | None, desc: str, enabled: bool):
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=desc, file=sys.stderr, leave=False)


def _write_tokens(path: Path, tokens: np.ndarray) -> None:
    with gzip.open(path, "wb", compresslevel=6) as fh:
        fh.write(tokens.astype(np.uint16).tobytes())


def _read_tokens(path: Path) -> np.ndarray:
    with gzip.open(path, "rb") as fh:
        return np.frombuffer(fh.read(), dtype=np.uint16)


def _encode_stream(tokenizer, texts: Sequence[str], eos_id: int, max_tokens: int | None, progress: bool, desc: str):
    """Encode documents in chunks, append `</s>` to each; stop after the document that crosses max_tokens."""
    backend = tokenizer.backend_tokenizer
    parts: list[np.ndarray] = []
    total, used = 0, 0
    chunk = 256
    for start in _progress(range(0, len(texts), chunk), (len(texts) + chunk - 1) // chunk, desc, progress):
        for enc in backend.encode_batch(list(texts[start : start + chunk]), add_special_tokens=False):
            ids = np.asarray(enc.ids + [eos_id], dtype=np.uint16)
            parts.append(ids)
            total += len(ids)
            used += 1
            if max_tokens is not None and total >= max_tokens:
                return np.concatenate(parts), used
    if not parts:
        return np.zeros(0, dtype=np.uint16), 0
    return np.concatenate(parts), used


def prepare_code_data(
    out_dir: str | os.PathLike,
    *,
    roots: Sequence[str | os.PathLike] | None = None,
    vocab_size: int = 8192,
    val_fraction: float = 0.01,
    max_train_tokens: int | None = 40_000_000,
    tokenizer_train_chars: int = 30_000_000,
    progress: bool = True,
    tokenizer_dir: str | os.PathLike | None = None,
) -> dict:
    """Code corpus → tokenizer + gzip'd token streams + meta.json in `out_dir`. Returns the meta dict.

    Training documents are taken in order of their content hash (a deterministic shuffle), so a token cap
    keeps a mix of stdlib and packages instead of the alphabetically first few.
    tokenizer_dir: encode with this existing tokenizer (e.g. a trained pair's, to train more drafters for it)
    instead of training one; `vocab_size` is then the tokenizer's own.
    """
    if vocab_size > 65536:
        raise ValueError(f"vocab_size must fit uint16 (≤ 65536), got {vocab_size}")
    out = Path(out_dir)
    docs = code_documents(roots, val_fraction=val_fraction)
    train = sorted((d for d in docs if d.split == "train"), key=lambda d: d.sha256)
    val = sorted((d for d in docs if d.split == "val"), key=lambda d: d.sha256)
    if not train or not val:
        raise EmptyCorpusError(f"code corpus: {len(train)} train / {len(val)} val files; need both "
                               f"(raise val_fraction or add files)")
    sample, chars = [], 0
    if tokenizer_dir is not None:
        tokenizer = load_tokenizer(tokenizer_dir)
        if tokenizer.convert_tokens_to_ids(EOS) in (None, tokenizer.unk_token_id):
            raise ValueError(f"tokenizer_dir: {tokenizer_dir} has no {EOS} token to end documents with")
    else:
        for d in train:
            if chars >= tokenizer_train_chars:
                break
            sample.append(d.text)
            chars += len(d.text)
        tokenizer = train_bpe_tokenizer(sample, vocab_size)
    if len(tokenizer) > 65536:
        raise ValueError(f"vocab_size must fit uint16 (≤ 65536), the tokenizer has {len(tokenizer)}")
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(out / "tokenizer"))
    eos_id = tokenizer.convert_tokens_to_ids(EOS)
    train_tokens, train_used = _encode_stream(tokenizer, [d.text for d in train], eos_id, max_train_tokens, progress, "encode train")
    val_tokens, _ = _encode_stream(tokenizer, [d.text for d in val], eos_id, None, progress, "encode val")
    _write_tokens(out / "train.bin.gz", train_tokens)
    _write_tokens(out / "val.bin.gz", val_tokens)
    meta = {
        "format_version": FORMAT_VERSION,
        "corpus": "code",
        "roots": [str(r) for r in (roots if roots is not None else python_source_roots())],
        "unique_files": len(docs),
        "train_files": len(train),
        "train_files_used": train_used,
        "val_files": len(val),
        "val_fraction": val_fraction,
        "vocab_size": len(tokenizer),
        "train_tokens": int(len(train_tokens)),
        "val_tokens": int(len(val_tokens)),
        "train_chars_used": int(sum(len(d.text) for d in train[:train_used])),
        "tokenizer_train_chars": chars,
        "tokenizer_from": None if tokenizer_dir is None else str(tokenizer_dir),
        "train_sha256": hashlib.sha256(train_tokens.tobytes()).hexdigest(),
        "val_sha256": hashlib.sha256(val_tokens.tobytes()).hexdigest(),
        "val_sources": [d.source for d in val],
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    logger.info("code data: %d train / %d val tokens in %s", len(train_tokens), len(val_tokens), out)
    return meta


def prepare_ende_data(
    out_dir: str | os.PathLike,
    *,
    mo_files: Sequence[str | os.PathLike] | None = None,
    locale_roots: Sequence[str | os.PathLike] | None = None,
    vocab_size: int = 8192,
    val_fraction: float = 0.025,
    seed: int = 0,
    ood_domains: Sequence[str] = OOD_DOMAINS,
) -> dict:
    """gettext EnDe pairs → tokenizer (appends </s>) + gzip'd JSON lines + meta.json in `out_dir`.

    train.jsonl.gz, val.jsonl.gz (the in-domain test set, in the order of a seeded shuffle, so any prefix is
    a random sample) and ood.jsonl.gz (the out-of-domain catalogs; absent from the corpus → no file);
    see `specdec.zoo.corpus.ende_pairs`. mo_files: catalogs (.mo/.po) to read instead of the locale roots."""
    pairs = ende_pairs(mo_files, locale_roots=locale_roots, val_fraction=val_fraction, seed=seed,
                       ood_domains=ood_domains)
    train = [p for p in pairs if p.split == "train"]
    val = sorted((p for p in pairs if p.split == "val"),
                 key=lambda p: hashlib.sha256(f"{seed}:{p.en}".encode()).digest())  # a seeded shuffle
    ood = [p for p in pairs if p.split == "ood"]
    if not train or not val:
        raise EmptyCorpusError(f"ende corpus: {len(train)} train / {len(val)} val pairs; need both")
    tokenizer = train_bpe_tokenizer((t for p in train for t in (p.en, p.de)), vocab_size, append_eos=True)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(out / "tokenizer"))
    (out / "ood.jsonl.gz").unlink(missing_ok=True)
    for name, rows in (("train", train), ("val", val), ("ood", ood)):
        if not rows:
            continue
        with gzip.open(out / f"{name}.jsonl.gz", "wt", encoding="utf-8", compresslevel=6) as fh:
            for p in rows:
                fh.write(json.dumps({"en": p.en, "de": p.de, "source": Path(p.source).name}, ensure_ascii=False) + "\n")
    catalogs = sorted({p.source for p in pairs})
    meta = {
        "format_version": FORMAT_VERSION,
        "corpus": "ende",
        "catalogs": catalogs,
        "catalog_count": len(catalogs),
        "train_pairs": len(train),
        "val_pairs": len(val),
        "val": "in-domain: a seeded random sample of the English messages (no English message in two splits)",
        "val_fraction": val_fraction,
        "seed": seed,
        "ood_pairs": len(ood),
        "ood": "out-of-domain: every message of whole catalogs of other programs",
        "ood_catalogs": sorted({Path(p.source).name for p in ood}),
        "train_english_messages": len({p.en for p in train}),
        "vocab_size": len(tokenizer),
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    return meta


# ------------------------------------------------------------------------------------------ reading


def read_meta(folder: str | os.PathLike) -> dict:
    path = Path(folder) / "meta.json"
    if not path.is_file():
        raise FileNotFoundError(f"{folder} is not a prepared data folder (no meta.json); run `specdec train prepare` first")
    return json.loads(path.read_text())


@dataclass
class TokenData:
    """A prepared code folder in memory: uint16 streams + the tokenizer folder."""

    train: np.ndarray
    val: np.ndarray
    tokenizer_dir: Path
    meta: dict

    @classmethod
    def load(cls, folder: str | os.PathLike) -> TokenData:
        folder = Path(folder)
        meta = read_meta(folder)
        if meta.get("corpus") != "code":
            raise ValueError(f"{folder} holds a {meta.get('corpus')!r} corpus, expected 'code'")
        return cls(_read_tokens(folder / "train.bin.gz"), _read_tokens(folder / "val.bin.gz"), folder / "tokenizer", meta)

    def train_batch(self, batch_size: int, seq_len: int, rng: np.random.Generator) -> torch.Tensor:
        """Random windows of seq_len + 1 tokens: `[B, T+1]` (inputs are [:, :-1], targets [:, 1:])."""
        return _windows(self.train, rng.integers(0, len(self.train) - seq_len - 1, size=batch_size), seq_len)

    def val_batches(self, batch_size: int, seq_len: int, max_batches: int) -> list[torch.Tensor]:
        """Fixed contiguous windows from the start of the validation stream (same every call)."""
        starts = np.arange(0, len(self.val) - seq_len - 1, seq_len)[: batch_size * max_batches]
        if len(starts) == 0:
            raise ValueError(f"validation stream ({len(self.val)} tokens) is shorter than seq_len+1={seq_len + 1}")
        return [_windows(self.val, starts[i : i + batch_size], seq_len) for i in range(0, len(starts), batch_size)]


def _windows(stream: np.ndarray, starts: np.ndarray, seq_len: int) -> torch.Tensor:
    idx = starts[:, None] + np.arange(seq_len + 1)[None, :]
    return torch.from_numpy(stream[idx].astype(np.int64))


@dataclass(frozen=True)
class Seq2SeqBatch:
    input_ids: torch.Tensor  # [B, S] source tokens (</s> at the end), padded with 0
    attention_mask: torch.Tensor  # [B, S]
    labels: torch.Tensor  # [B, T] target tokens (</s> at the end), -100 on padding

    def to(self, device: torch.device | str) -> Seq2SeqBatch:
        return Seq2SeqBatch(self.input_ids.to(device), self.attention_mask.to(device), self.labels.to(device))


def _clip(ids: list[int], max_len: int) -> list[int]:
    """At most max_len ids, keeping the final </s> when a long message is cut (short ones are untouched:
    appending ids[-1:] unconditionally used to end every pair with </s> </s>)."""
    return ids if len(ids) <= max_len else ids[: max_len - 1] + ids[-1:]


@dataclass
class PairData:
    """A prepared ende folder in memory, tokenized: lists of (source ids, target ids)."""

    train: list[tuple[list[int], list[int]]]
    val: list[tuple[list[int], list[int]]]
    tokenizer_dir: Path
    meta: dict
    max_len: int
    ood: list[tuple[list[int], list[int]]] = field(default_factory=list)  # out-of-domain test pairs, if any
    _pending: dict[int, list[list[int]]] = field(default_factory=dict, repr=False)  # batches drawn, not yet used
    _arrays: tuple | None = field(default=None, repr=False)  # (train, token_batch's padded matrices), built on use

    @classmethod
    def load(cls, folder: str | os.PathLike, max_len: int = 96) -> PairData:
        folder = Path(folder)
        meta = read_meta(folder)
        if meta.get("corpus") != "ende":
            raise ValueError(f"{folder} holds a {meta.get('corpus')!r} corpus, expected 'ende'")
        tokenizer = load_tokenizer(folder / "tokenizer")

        def read(name: str) -> list[tuple[list[int], list[int]]]:
            with gzip.open(folder / f"{name}.jsonl.gz", "rt", encoding="utf-8") as fh:
                rows = [json.loads(line) for line in fh]
            src = tokenizer.backend_tokenizer.encode_batch([r["en"] for r in rows])
            tgt = tokenizer.backend_tokenizer.encode_batch([r["de"] for r in rows])
            return [(_clip(s.ids, max_len), _clip(t.ids, max_len)) for s, t in zip(src, tgt)]

        ood = read("ood") if (folder / "ood.jsonl.gz").is_file() else []
        return cls(read("train"), read("val"), folder / "tokenizer", meta, max_len, ood)

    @staticmethod
    def collate(rows: Sequence[tuple[list[int], list[int]]]) -> Seq2SeqBatch:
        s_len = max(len(s) for s, _ in rows)
        t_len = max(len(t) for _, t in rows)
        input_ids = torch.zeros(len(rows), s_len, dtype=torch.long)
        attention_mask = torch.zeros(len(rows), s_len, dtype=torch.long)
        labels = torch.full((len(rows), t_len), -100, dtype=torch.long)
        for i, (s, t) in enumerate(rows):
            input_ids[i, : len(s)] = torch.tensor(s)
            attention_mask[i, : len(s)] = 1
            labels[i, : len(t)] = torch.tensor(t)
        return Seq2SeqBatch(input_ids, attention_mask, labels)

    def train_batch(self, batch_size: int, seq_len: int, rng: np.random.Generator) -> Seq2SeqBatch:
        """`batch_size` random training pairs, padded to the longest row. Pairs are drawn uniformly,
        BUCKET_BATCHES batches at a time; those are sorted by length and handed out in random order, so a batch
        pads to a length near its rows' while every pair stays equally likely (gettext pairs: 87% of a uniform
        batch of 256 is padding, 27% of a bucketed one)."""
        del seq_len  # pairs are short; padded to the longest row
        pending = self._pending.get(batch_size)
        if not pending:
            draws = rng.integers(0, len(self.train), size=batch_size * BUCKET_BATCHES)
            draws = sorted(draws.tolist(), key=lambda i: len(self.train[i][0]) + len(self.train[i][1]))
            chunks = [draws[k : k + batch_size] for k in range(0, len(draws), batch_size)]
            pending = self._pending[batch_size] = [chunks[k] for k in rng.permutation(len(chunks))]
        return self.collate([self.train[i] for i in pending.pop()])

    def token_batch(self, max_tokens: int, rng: np.random.Generator, multiple: int = PAD_MULTIPLE) -> Seq2SeqBatch:
        """Random training pairs filling at most `max_tokens` padded positions, source and target together:
        rows × (longest source + longest target), each length rounded up to `multiple`.

        Pairs are drawn uniformly, about BUCKET_BATCHES batches' worth at a time; those are sorted by padded
        length (the longer side first), cut greedily into batches under the budget and handed out in random
        order. So every drawn pair is trained on once, a batch pads little (gettext pairs: ~9% padding), and a
        batch of long pairs holds as many tokens as one of short pairs, so it dominates neither the memory nor
        the loss."""
        if multiple < 1:
            raise ValueError(f"multiple must be ≥ 1, got {multiple}")
        longest = 2 * (-(-self.max_len // multiple) * multiple)  # a pair of two clipped sides, padded
        if max_tokens < longest:
            raise ValueError(f"max_tokens must be ≥ {longest} (2 × max_len, padded) so that any pair fits, "
                             f"got {max_tokens}")
        src, src_len, tgt, tgt_len = self._train_arrays()
        key = -max_tokens  # token batches pend apart from fixed-size ones
        pending = self._pending.get(key)
        if not pending:
            mean = float(src_len.mean() + tgt_len.mean())
            draws = rng.integers(0, len(self.train), size=max(64, int(BUCKET_BATCHES * max_tokens / mean)))
            s_up = -(-src_len[draws] // multiple) * multiple
            t_up = -(-tgt_len[draws] // multiple) * multiple
            order = np.lexsort((t_up, s_up, np.maximum(s_up, t_up)))
            draws, s_up, t_up = draws[order], s_up[order], t_up[order]
            # greedy cut: a batch ends where one more row would push rows × (max s + max t) over the budget
            chunks, lo, s_max, t_max = [], 0, 0, 0
            for k in range(len(draws)):
                s_new, t_new = max(s_max, s_up[k]), max(t_max, t_up[k])
                if k > lo and (k - lo + 1) * (s_new + t_new) > max_tokens:
                    chunks.append(draws[lo:k])
                    lo, s_new, t_new = k, s_up[k], t_up[k]
                s_max, t_max = s_new, t_new
            chunks.append(draws[lo:])
            pending = self._pending[key] = [chunks[k] for k in rng.permutation(len(chunks))]
        rows = pending.pop()
        s_len = int(-(-src_len[rows].max() // multiple) * multiple)
        t_len = int(-(-tgt_len[rows].max() // multiple) * multiple)
        input_ids = torch.from_numpy(src[rows, :s_len].astype(np.int64))
        labels = torch.from_numpy(tgt[rows, :t_len].astype(np.int64))
        attention_mask = (torch.arange(s_len)[None, :] < torch.from_numpy(src_len[rows])[:, None]).long()
        return Seq2SeqBatch(input_ids, attention_mask, labels)

    def _train_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The training pairs as padded matrices (source: 0-padded; target: -100-padded) and their lengths."""
        if self._arrays is None or self._arrays[0] is not self.train:  # built for this list of pairs
            n = len(self.train)
            src = np.zeros((n, self.max_len), dtype=np.int32)
            tgt = np.full((n, self.max_len), -100, dtype=np.int32)
            src_len = np.fromiter((len(s) for s, _ in self.train), dtype=np.int64, count=n)
            tgt_len = np.fromiter((len(t) for _, t in self.train), dtype=np.int64, count=n)
            for i, (s, t) in enumerate(self.train):
                src[i, : len(s)] = s
                tgt[i, : len(t)] = t
            self._arrays = (self.train, (src, src_len, tgt, tgt_len))
        return self._arrays[1]

    def val_batches(self, batch_size: int, seq_len: int, max_batches: int) -> list[Seq2SeqBatch]:
        del seq_len
        rows = self.val[: batch_size * max_batches]
        return [self.collate(rows[i : i + batch_size]) for i in range(0, len(rows), batch_size)]


def load_data(folder: str | os.PathLike) -> TokenData | PairData:
    """Either kind of prepared folder, by its meta.json."""
    corpus = read_meta(folder).get("corpus")
    if corpus == "code":
        return TokenData.load(folder)
    if corpus == "ende":
        return PairData.load(folder)
    raise ValueError(f"{folder}: unknown corpus {corpus!r} in meta.json")
