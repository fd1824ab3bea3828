"""gettext catalogs on disk: find the German ones, read their (msgid, msgstr) entries.

- `find_catalogs(roots)`: every `*.mo` / `*.po` below `roots` that belongs to the `de` language: a folder
  of the path is `de`, `de_XX` or `de-XX` (`/usr/share/locale/de/LC_MESSAGES/tar.mo`,
  Kodi's `language/resource.language.de_de/strings.po`, LibreOffice's
  `program/resource/de/LC_MESSAGES/sw.mo`, Django's `conf/locale/de/LC_MESSAGES/django.po`), or the
  file itself is named after it (Tryton's `ir/locale/de.po`). Walks are sorted, symlinks not followed.
- `read_mo(path)`, `read_po(path)`: entries with the header skipped, a context (`msgctxt`) dropped and a
  plural entry reduced to its singular forms; `.po` entries marked fuzzy and obsolete (`#~`) ones skipped.
- `catalog_domain(path)`: the text domain (`tar`, `sw`, `django`; for `ir/locale/de.po`, `ir`).
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Iterable
from pathlib import Path

CATALOG_SUFFIXES = (".mo", ".po")
_SKIPPED_DIRS = frozenset({"__pycache__", "node_modules", ".git"})


def is_lang_name(name: str, lang: str = "de") -> bool:
    """`de`, `de_AT`, `de_CH`, `de-DE`, Kodi's `resource.language.de_de`: a locale name of `lang`. Script
    variants (`de@hebrew`: German transliterated into Hebrew letters) are not German text."""
    name = name.rsplit(".", 1)[-1]
    return name == lang or (name.startswith((lang + "_", lang + "-")) and "@" not in name)


def find_catalogs(roots: Iterable[str | os.PathLike], lang: str = "de") -> list[Path]:
    """The `lang` catalogs (`.mo`, `.po`) below each existing root, sorted, each file once."""
    found: set[Path] = set()
    for root in roots:
        root = Path(root)
        if not root.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in _SKIPPED_DIRS)
            rel = Path(dirpath).relative_to(root).parts
            in_lang_dir = any(is_lang_name(part, lang) for part in (root.name, *rel))
            for name in filenames:
                path = Path(dirpath) / name
                if path.suffix in CATALOG_SUFFIXES and (in_lang_dir or is_lang_name(path.stem, lang)) \
                        and path.is_file() and not path.is_symlink():
                    found.add(path)
    return sorted(found)


def catalog_domain(path: str | os.PathLike, lang: str = "de") -> str:
    """The catalog's text domain: its file stem, or for `<domain>/locale/de.po` the folder above `locale`."""
    path = Path(path)
    if not is_lang_name(path.stem, lang):
        return path.stem
    parents = [p.name for p in path.parents if p.name and p.name not in ("locale", "locales", "i18n", "po")]
    return parents[0] if parents else path.stem


def _charset(header: str) -> str:
    for line in header.splitlines():
        if line.lower().startswith("content-type:") and "charset=" in line:
            charset = line.split("charset=", 1)[1].strip().strip(";").strip() or "utf-8"
            try:
                "".encode(charset)
                return charset
            except LookupError:
                return "utf-8"
    return "utf-8"


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
    header = next((msgstr for msgid, msgstr in raw if msgid == b""), b"")
    charset = _charset(header.decode("ascii", "replace"))  # "Content-Type: text/plain; charset=ISO-8859-1"
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


_PO_LINE = re.compile(r'^(msgctxt|msgid|msgid_plural|msgstr(?:\[(\d+)\])?)\s+"(.*)"\s*$')
_PO_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "a": "\a", "b": "\b", "f": "\f", "v": "\v"}


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: _PO_ESCAPES.get(m.group(1), m.group(0)), text)


def read_po(path: str | os.PathLike) -> list[tuple[str, str]]:
    """(msgid, msgstr) entries of a gettext .po file (text form of a .mo): the same reduction as `read_mo`;
    entries flagged `fuzzy` (a translator's guess awaiting review) and obsolete `#~` entries are skipped."""
    data = Path(path).read_bytes()
    charset = "utf-8"
    head = data[:4000].decode("ascii", "replace").replace('\\n"\n"', "\n").replace("\\n", "\n")
    if "charset=" in head:
        charset = _charset(next((line.strip().strip('"') for line in head.splitlines() if "charset=" in line), ""))
    text = data.decode(charset, "replace")
    entries: list[tuple[str, str]] = []
    fields: dict[str, str] = {}
    fuzzy = False
    key: str | None = None

    def flush() -> None:
        msgid = fields.get("msgid")
        if msgid and not fuzzy:
            entries.append((msgid, fields.get("msgstr", fields.get("msgstr[0]", ""))))

    for line in text.splitlines():
        line = line.strip()
        complete = "msgid" in fields and any(k.startswith("msgstr") for k in fields)
        if not line or line.startswith("#"):  # a blank line ends an entry; "#~" (obsolete) lines are comments
            if complete or (not line and fields):
                flush()
                fields, fuzzy, key = {}, False, None
            if line.startswith("#,") and "fuzzy" in line:
                fuzzy = True  # flags the entry that follows
            continue
        m = _PO_LINE.match(line)
        if m:
            key = m.group(1)
            if key in ("msgctxt", "msgid") and complete:  # the next entry, without a blank line between
                flush()
                fields, fuzzy = {}, False
            fields[key] = _unescape(m.group(3))
        elif line.startswith('"') and line.endswith('"') and key is not None:
            fields[key] = fields.get(key, "") + _unescape(line[1:-1])
    if fields:
        flush()
    return entries


def read_catalog(path: str | os.PathLike) -> list[tuple[str, str]]:
    """`read_po` for `.po` files, `read_mo` otherwise."""
    return read_po(path) if Path(path).suffix == ".po" else read_mo(path)
