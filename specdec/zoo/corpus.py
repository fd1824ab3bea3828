"""Corpora read from local files: deterministic, deduplicated, validation split by file.

- `code_documents()`: every `*.py` file under the interpreter's stdlib and site-packages folders.
  Roots and walks are sorted; files are deduplicated by the SHA-256 of their bytes (the first path in
  sorted order wins); a file is in the validation split when the hash of its content falls below
  `val_fraction`, so the split does not depend on where the file happens to live.
- `ende_pairs()`: (English, German) message pairs from the German gettext catalogs (`.mo` and `.po`, see
  `specdec.zoo.catalogs`) below the locale roots: the system's and the folder scripts/device_run.sh ende-packages
  fills from apt and pip packages. Untranslated entries (empty, or msgstr == msgid), pure format strings,
  identifier msgids, over-long and length-mismatched pairs are dropped; shortcut markers (`_Open`, `&Open`,
  `~Open`) are removed; pairs are deduplicated on (en, de). Three splits, no English message (ignoring
  case, spaces and punctuation) in two of them: "ood", the messages of three whole catalogs of other
  programs (`OOD_DOMAINS`: apt, findutils, gsettings-desktop-schemas); "val", the in-domain test set, a
  seeded random `val_fraction` of the other English messages (one reference each); "train", the rest.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import sys
import sysconfig
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from specdec.zoo.catalogs import catalog_domain, find_catalogs, read_catalog, read_mo  # noqa: F401 (re-exported)

logger = logging.getLogger(__name__)

# Where German gettext catalogs live once the packages of scripts/device_run.sh ende-packages are installed: the system
# locale folders (apt packages), LibreOffice's and Vim's own, and the pip packages' folder (installed there
# with --target, outside any environment: they are read, never imported).
DEFAULT_LOCALE_ROOTS: tuple[str, ...] = (
    "/usr/share/locale",
    "/usr/share/locale-langpack",
    "/usr/local/share/locale",
    "/usr/lib/libreoffice/program/resource",
    "/usr/share/vim",
)
ENDE_PACKAGES_ENV = "SPECDEC_ENDE_PACKAGES"  # overrides the pip packages' folder below


def ende_packages_dir() -> Path:
    """The folder scripts/device_run.sh ende-packages installs the pip packages into ($SPECDEC_ENDE_PACKAGES or
    ~/.cache/specdec/ende-packages)."""
    env = os.environ.get(ENDE_PACKAGES_ENV)
    return Path(env) if env else Path.home() / ".cache" / "specdec" / "ende-packages"


def default_locale_roots() -> list[Path]:
    """DEFAULT_LOCALE_ROOTS and the pip packages' folder, those that exist."""
    return [p for p in (*map(Path, DEFAULT_LOCALE_ROOTS), ende_packages_dir()) if p.is_dir()]
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

# The three catalogs the first EnDe runs held out whole (chosen then by the hash of the domain name):
# other programs' messages, kept fixed as the out-of-domain test set so its numbers compare across corpora.
OOD_DOMAINS: tuple[str, ...] = ("apt", "findutils", "gsettings-desktop-schemas")
MAX_PAIR_CHARS = 300  # longer messages (help paragraphs) would be cut at the models' 96 tokens
MAX_LENGTH_RATIO = 3.0  # German/English character ratio beyond this (either way) is a misaligned pair


_FORMAT_SPEC = re.compile(r"%(\d+\$)?[-+ #0']*(\*|\d+)?(\.(\*|\d+))?(hh|h|ll|l|L|q|j|z|t)?[a-zA-Z%]|\{[^{}]*\}")


_IDENTIFIER = re.compile(r"[a-z0-9]+(?:_[a-z0-9]+)+|[A-Z0-9]+(?:_[A-Z0-9]+)+")  # Plone's "box_sign_in", "SESSION_NAME"
_MNEMONIC_MARKS = ("_", "&", "~")  # GTK "_Open", KDE/Qt "&Open", LibreOffice "~Open": the menu's shortcut letter


def _strip_mnemonic(text: str, other: str) -> str:
    """`text` without its keyboard-shortcut marker: a `_`, `&` or `~` before a letter or digit, once in the
    text, in a word that `other` (the pair's other side) does not contain verbatim, as it would an identifier
    (`h_aliases`), a format (`~a`) or an entity (`&nbsp;`)."""
    for mark in _MNEMONIC_MARKS:
        words = re.findall(r"[^\W_]*" + re.escape(mark) + r"[^\W_]+;?", text)
        if len(words) == 1 and words[0] not in other and not words[0].endswith(";"):
            return text.replace(words[0], words[0].replace(mark, "", 1), 1)
    return text


def normalize_pair(en: str, de: str) -> tuple[str, str]:
    """Both sides stripped of surrounding space and of their shortcut markers (`Ma_ximize` → `Maximize`,
    `Ver_größern` → `Vergrößern`): 6% of the pairs carry one, at a different letter on each side."""
    en, de = en.strip(), de.strip()
    return _strip_mnemonic(en, de), _strip_mnemonic(de, en)


def split_key(en: str) -> str:
    """What decides an English message's split: its letters and digits, lower-cased, so that near-duplicates
    ("Blending", "Blending:", "blending") fall on the same side (10% of a random test set had one in training)."""
    return re.sub(r"[\W_]+", "", en.lower())


def _usable_pair(en: str, de: str) -> bool:
    # skip untranslated entries (empty, or msgstr == msgid: 21% of the Ubuntu catalogs' pairs, mostly ISO
    # language and region names, which taught the translator to copy its input), pure format strings
    # such as "%s: %s" or "{name}", message ids that are not English (Plone's "box_sign_in"), messages too
    # long for the models, and pairs whose lengths disagree
    en, de = en.strip(), de.strip()
    if not en or not de or en == de or max(len(en), len(de)) > MAX_PAIR_CHARS or _IDENTIFIER.fullmatch(en):
        return False
    if max(len(en), len(de)) > 20 and max(len(en), len(de)) > MAX_LENGTH_RATIO * min(len(en), len(de)):
        return False
    return any(ch.isalpha() for ch in _FORMAT_SPEC.sub("", en))


def ende_pairs(
    files: Sequence[str | os.PathLike] | None = None,
    *,
    locale_roots: Iterable[str | os.PathLike] | None = None,
    val_fraction: float = 0.025,
    seed: int = 0,
    ood_domains: Iterable[str] = OOD_DOMAINS,
) -> list[Pair]:
    """Deduplicated English→German pairs from gettext catalogs, each tagged "train", "val" or "ood".

    files: catalogs (`.mo`/`.po`) to read; default: `find_catalogs(locale_roots or default_locale_roots())`.
    "ood": every English message of the `ood_domains` catalogs, once (the first translation in path order).
    "val" (the in-domain test set): of the other English messages, those whose seeded hash falls below
    `val_fraction`, once each. "train": every other (en, de) pair (an English message keeps all its
    distinct translations). Messages are compared by `split_key` (case, spaces and punctuation ignored): no
    English message, nor a near-duplicate of it, is in two splits.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    roots = list(default_locale_roots() if locale_roots is None else locale_roots)
    paths = [Path(f) for f in files] if files is not None else find_catalogs(roots)
    missing = [str(f) for f in paths if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"ende corpus: no such catalog(s): {', '.join(missing)}")
    if not paths:
        where = ", ".join(str(r) for r in roots)
        raise EmptyCorpusError(f"ende corpus is empty: no German .mo/.po catalogs found below {where}")
    ood = frozenset(ood_domains)
    seen: set[tuple[str, str]] = set()
    rows: list[tuple[Path, str, str, bool]] = []  # (catalog, en, de, from an ood catalog)
    bad = 0
    for path in paths:
        try:
            entries = read_catalog(path)
        except (OSError, ValueError) as err:
            logger.warning("skipping %s: %s", path, err)
            bad += 1
            continue
        in_ood = catalog_domain(path) in ood
        for en, de in entries:
            en, de = normalize_pair(en, de)
            if _usable_pair(en, de) and (en, de) not in seen:
                seen.add((en, de))
                rows.append((path, en, de, in_ood))
    if not rows:
        raise EmptyCorpusError(f"ende corpus is empty: {len(paths)} catalog(s) held no usable pairs ({bad} unreadable)")
    ood_keys = {split_key(en) for _, en, _, in_ood in rows if in_ood}
    pairs: list[Pair] = []
    once: set[str] = set()  # test messages already taken (one reference each)
    for path, en, de, in_ood in rows:
        key = split_key(en)
        if key in ood_keys:
            split = "ood"
        else:
            split = "val" if hash_fraction(f"ende-val:{seed}:{key}") < val_fraction else "train"
        if split != "train":
            if key in once or (split == "ood" and not in_ood):
                continue  # one reference per test message; an ood message's from its own catalog
            once.add(key)
        pairs.append(Pair(str(path), en, de, split))
    logger.info("ende corpus: %d unique pairs from %d catalogs", len(pairs), len(paths))
    return pairs
