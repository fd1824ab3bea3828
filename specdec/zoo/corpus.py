"""Corpora read from local files: deterministic, deduplicated, validation split by file.

- `code_documents()`: every `*.py` file under the interpreter's stdlib and site-packages folders.
  Roots and walks are sorted; files are deduplicated by the SHA-256 of their bytes (the first path in
  sorted order wins); a file is in the validation split when the hash of its content falls below
  `val_fraction`, so the split does not depend on where the file happens to live.
- `ende_pairs()`: (English, German) message pairs from gettext catalogs (`*.mo`) of the `de` locales.
  The header entry (empty msgid) is skipped, a context prefix (`msgctxt\\x04`) is dropped, a plural
  entry contributes its singular forms, untranslated entries (empty, or msgstr == msgid) are dropped.
  Pairs are deduplicated on (en, de); the split is chosen per catalog FILE (by the hash of its domain
  name, e.g. `coreutils`), so a program's messages never straddle the two splits.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import struct
import sys
import sysconfig
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

DEFAULT_LOCALE_ROOTS: tuple[str, ...] = (
    "/usr/share/locale",
    "/usr/share/locale-langpack",
    "/usr/local/share/locale",
)
_PRUNED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})
MAX_CODE_FILE_BYTES = 1_000_000  # larger .py files are generated tables, not code worth learning


class EmptyCorpusError(ValueError):
    """No usable document was found; the message names where we looked."""


@dataclass(frozen=True)
class Document:
    source: str  # path (code) or catalog file (ende) it came from
    sha256: str  # hash of the content (code) or of the split key (ende)
    text: str
    split: str  # "train" | "val"


@dataclass(frozen=True)
class Pair:
    source: str
    en: str
    de: str
    split: str


def hash_fraction(key: str | bytes) -> float:
    """A stable number in [0, 1) from a string or bytes: the split decision."""
    if isinstance(key, str):
        key = key.encode("utf-8")
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") / 2**64


def split_of(key: str | bytes, val_fraction: float) -> str:
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    return "val" if hash_fraction(b"split:" + (key.encode() if isinstance(key, str) else key)) < val_fraction else "train"


# --------------------------------------------------------------------------------------------- code


def python_source_roots() -> list[Path]:
    """The folders holding the running interpreter's Python sources: stdlib and site-packages."""
    paths = sysconfig.get_paths()
    candidates = [paths.get("stdlib"), paths.get("purelib"), paths.get("platlib")]
    candidates += [p for p in sys.path if p and ("site-packages" in p or "dist-packages" in p)]
    roots: list[Path] = []
    for c in candidates:
        if c and os.path.isdir(c):
            path = Path(c).resolve()
            if path not in roots:
                roots.append(path)
    # a root nested inside another (site-packages inside a stdlib folder) is walked once
    roots = sorted(roots)
    return [r for r in roots if not any(r != o and o in r.parents for o in roots)]


def iter_python_files(roots: Sequence[str | os.PathLike]) -> Iterator[Path]:
    """Every `*.py` file under `roots`, in sorted order (folders and files sorted at each level)."""
    for root in sorted(Path(r) for r in roots):
        for dirpath, dirnames, filenames in os.walk(root):
            # a site-packages folder below a root (the base interpreter's, seen from a venv) is not on
            # sys.path, so its files are not visible to the running interpreter; caches hold no sources
            dirnames[:] = sorted(d for d in dirnames if d not in _PRUNED_DIRS)
            for name in sorted(filenames):
                if name.endswith(".py"):
                    yield Path(dirpath) / name


def code_documents(
    roots: Sequence[str | os.PathLike] | None = None,
    *,
    val_fraction: float = 0.01,
    max_file_bytes: int = MAX_CODE_FILE_BYTES,
) -> list[Document]:
    """Deduplicated Python source files, each tagged train/val by the hash of its content."""
    roots = python_source_roots() if roots is None else [Path(r) for r in roots]
    missing = [str(r) for r in roots if not Path(r).is_dir()]
    if missing:
        raise FileNotFoundError(f"code corpus: no such folder(s): {', '.join(missing)}")
    seen: set[str] = set()
    docs: list[Document] = []
    skipped = 0
    for path in iter_python_files(roots):
        try:
            if path.is_symlink() or not path.is_file():
                continue
            raw = path.read_bytes()
        except OSError:
            skipped += 1
            continue
        if not raw.strip() or len(raw) > max_file_bytes:
            skipped += 1
            continue
        digest = hashlib.sha256(raw).hexdigest()
        if digest in seen:
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            skipped += 1
            continue
        seen.add(digest)
        docs.append(Document(str(path), digest, text.replace("\r\n", "\n"), split_of(digest, val_fraction)))
    if not docs:
        raise EmptyCorpusError(f"code corpus is empty: no readable .py files under {', '.join(map(str, roots))}")
    logger.info("code corpus: %d unique files (%d skipped) from %d roots", len(docs), skipped, len(roots))
    return docs


# --------------------------------------------------------------------------------------------- ende


def read_mo(path: str | os.PathLike) -> list[tuple[str, str]]:
    """(msgid, msgstr) entries of a GNU .mo catalog, decoded with the catalog's own charset.

    Plural entries (`msgid\\0msgid_plural` → `form0\\0form1...`) give (msgid, form0); the header entry is
    skipped; a context prefix `ctx\\x04` is removed.
    """
    data = Path(path).read_bytes()
    if len(data) < 28:
        raise ValueError(f"{path}: not a .mo file (too short)")
    magic = struct.unpack("<I", data[:4])[0]
    if magic == 0x950412DE:
        order = "<"
    elif magic == 0xDE120495:
        order = ">"
    else:
        raise ValueError(f"{path}: not a .mo file (bad magic {magic:#x})")
    _revision, count, orig_offset, trans_offset = struct.unpack(order + "4I", data[4:20])
    raw: list[tuple[bytes, bytes]] = []
    for i in range(count):
        olen, ooff = struct.unpack(order + "2I", data[orig_offset + 8 * i : orig_offset + 8 * i + 8])
        tlen, toff = struct.unpack(order + "2I", data[trans_offset + 8 * i : trans_offset + 8 * i + 8])
        raw.append((data[ooff : ooff + olen], data[toff : toff + tlen]))
    charset = "utf-8"
    for msgid, msgstr in raw:
        if msgid == b"":  # header: "Content-Type: text/plain; charset=ISO-8859-1"
            for line in msgstr.decode("ascii", "replace").splitlines():
                if line.lower().startswith("content-type:") and "charset=" in line:
                    charset = line.split("charset=", 1)[1].strip().strip(";") or "utf-8"
    try:
        "".encode(charset)
    except LookupError:
        charset = "utf-8"
    entries: list[tuple[str, str]] = []
    for msgid, msgstr in raw:
        if not msgid:
            continue
        if b"\x04" in msgid:
            msgid = msgid.split(b"\x04", 1)[1]
        msgid = msgid.split(b"\x00", 1)[0]
        msgstr = msgstr.split(b"\x00", 1)[0]
        entries.append((msgid.decode(charset, "replace"), msgstr.decode(charset, "replace")))
    return entries


def find_mo_files(locale_roots: Iterable[str | os.PathLike] = DEFAULT_LOCALE_ROOTS, lang: str = "de") -> list[Path]:
    """`<root>/<lang>*/LC_MESSAGES/*.mo` for each root that exists, sorted (de, de_AT, de_CH, ...)."""
    found: set[Path] = set()
    for root in locale_roots:
        root = Path(root)
        if not root.is_dir():
            continue
        for locale_dir in root.iterdir():
            name = locale_dir.name
            if name == lang or name.startswith(lang + "_") or name.startswith(lang + "@"):
                found.update(p for p in (locale_dir / "LC_MESSAGES").glob("*.mo") if p.is_file())
    return sorted(found)


_FORMAT_SPEC = re.compile(r"%(\d+\$)?[-+ #0']*(\*|\d+)?(\.(\*|\d+))?(hh|h|ll|l|L|q|j|z|t)?[a-zA-Z%]|\{[^{}]*\}")


def _usable_pair(en: str, de: str) -> bool:
    # skip untranslated entries (empty, or msgstr == msgid: 21% of the Ubuntu catalogs' pairs, mostly ISO
    # language and region names, which taught the translator to copy its input) and pure format strings
    # such as "%s: %s" or "{name}"
    return (bool(en.strip()) and bool(de.strip()) and en.strip() != de.strip()
            and any(ch.isalpha() for ch in _FORMAT_SPEC.sub("", en)))


def ende_pairs(
    mo_files: Sequence[str | os.PathLike] | None = None,
    *,
    locale_roots: Iterable[str | os.PathLike] = DEFAULT_LOCALE_ROOTS,
    val_fraction: float = 0.05,
) -> list[Pair]:
    """Deduplicated English→German pairs from gettext catalogs; split by catalog (domain) name."""
    files = [Path(f) for f in mo_files] if mo_files is not None else find_mo_files(locale_roots)
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"ende corpus: no such catalog(s): {', '.join(missing)}")
    if not files:
        where = ", ".join(str(f) for f in (mo_files or [f"{r}/de*/LC_MESSAGES" for r in locale_roots]))
        raise EmptyCorpusError(f"ende corpus is empty: no .mo catalogs found in {where}")
    seen: set[tuple[str, str]] = set()
    pairs: list[Pair] = []
    bad = 0
    for path in files:
        try:
            entries = read_mo(path)
        except (OSError, ValueError) as err:
            logger.warning("skipping %s: %s", path, err)
            bad += 1
            continue
        split = split_of(path.stem, val_fraction)  # the domain: de and de_CH catalogs of one program agree
        for en, de in entries:
            if not _usable_pair(en, de) or (en, de) in seen:
                continue
            seen.add((en, de))
            pairs.append(Pair(str(path), en, de, split))
    if not pairs:
        raise EmptyCorpusError(f"ende corpus is empty: {len(files)} catalog(s) held no usable pairs ({bad} unreadable)")
    logger.info("ende corpus: %d unique pairs from %d catalogs", len(pairs), len(files))
    return pairs
