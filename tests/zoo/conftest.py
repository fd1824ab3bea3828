"""Shared fixtures: a small synthetic code tree, a prepared data folder and .mo catalogs built on the fly."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest


def synthetic_module(i: int) -> str:
    """Deterministic Python-looking text with plenty of repetition (so tiny models learn fast)."""
    lines = [f'"""Module {i}."""', "", "import os", "import sys", ""]
    for j in range(12):
        lines += [f"def func_{i}_{j}(x, y={j}):", f"    total = x + y * {j % 5}",
                  "    for k in range(y):", "        total += k", "    return total", ""]
    lines += ["class Thing:", "    def __init__(self, value):", "        self.value = value", ""]
    return "\n".join(lines)


@pytest.fixture(scope="session")
def code_tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("code_tree")
    for i in range(30):
        pkg = root / f"pkg{i % 3}"
        pkg.mkdir(exist_ok=True)
        (pkg / f"mod{i}.py").write_text(synthetic_module(i))
    (root / "pkg0" / "copy_of_mod3.py").write_text(synthetic_module(3))  # duplicate content
    (root / "pkg1" / "empty.py").write_text("   \n")
    (root / "pkg1" / "notes.txt").write_text("not python")
    return root


@pytest.fixture(scope="session")
def code_data(tmp_path_factory, code_tree) -> Path:
    from specdec.zoo.data import prepare_code_data

    out = tmp_path_factory.mktemp("code_data")
    prepare_code_data(out, roots=[code_tree], vocab_size=320, val_fraction=0.2, progress=False)
    return out


def write_mo(path: Path, entries: dict[bytes, bytes], charset: str = "UTF-8") -> None:
    """A minimal GNU .mo writer (little-endian), header entry included."""
    header = f"Content-Type: text/plain; charset={charset}\n".encode("ascii")
    items = sorted({b"": header, **entries}.items())
    n = len(items)
    orig_table, trans_table = 28, 28 + 8 * n
    offset = 28 + 16 * n
    ids = b""
    strs = b""
    orig_entries, trans_entries = [], []
    for k, _ in items:
        orig_entries.append((len(k), offset + len(ids)))
        ids += k + b"\0"
    base = offset + len(ids)
    for _, v in items:
        trans_entries.append((len(v), base + len(strs)))
        strs += v + b"\0"
    data = struct.pack("<7I", 0x950412DE, 0, n, orig_table, trans_table, 0, 0)
    data += b"".join(struct.pack("<2I", *e) for e in orig_entries)
    data += b"".join(struct.pack("<2I", *e) for e in trans_entries)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data + ids + strs)


@pytest.fixture(scope="session")
def locale_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("locale")
    for d in range(8):
        entries = {f"Open file {d}-{k}".encode(): f"Datei {d}-{k} öffnen".encode() for k in range(20)}
        entries[b"Quit"] = b"Beenden"  # the same pair in every catalog: deduplicated
        entries[b"%s"] = b"%s"  # no letters: skipped
        entries[b"menu\x04Save"] = b"Speichern"  # context prefix dropped
        entries[b"%d file\x00%d files"] = b"%d Datei\x00%d Dateien"  # plural: singular kept
        write_mo(root / "de" / "LC_MESSAGES" / f"prog{d}.mo", entries)
    write_mo(root / "de_CH" / "LC_MESSAGES" / "latin.mo", {b"Size": "Größe".encode("latin-1")}, charset="ISO-8859-1")
    write_mo(root / "fr" / "LC_MESSAGES" / "prog0.mo", {b"Quit": b"Quitter"})
    write_mo(root / "de@hebrew" / "LC_MESSAGES" / "prog0.mo", {b"Stop": "שטאָפּ".encode()})  # not German text
    # an out-of-domain catalog (OOD_DOMAINS): "Quit" is in it too, so it leaves the training set
    write_mo(root / "de" / "LC_MESSAGES" / "apt.mo", {b"Quit": b"Beenden", b"Remove package": b"Paket entfernen"})
    # .po files, as pip packages ship them: a Django-style tree and a Tryton-style `<module>/locale/de.po`
    write_po(root / "site" / "app" / "locale" / "de" / "LC_MESSAGES" / "django.po",
             [("Add user", "Benutzer hinzufügen"), ("Delete user", "Benutzer löschen")])
    write_po(root / "site" / "mod" / "locale" / "de.po", [("Save record", "Datensatz speichern")])
    write_po(root / "site" / "mod" / "locale" / "fr.po", [("Save record", "Enregistrer")])
    return root


def write_po(path: Path, entries: list[tuple[str, str]]) -> None:
    """A .po file: header, the entries, and one fuzzy entry (which readers skip)."""
    lines = ['msgid ""', 'msgstr ""', '"Content-Type: text/plain; charset=UTF-8\\n"', ""]
    for en, de in entries:
        lines += [f'msgid "{en}"', f'msgstr "{de}"', ""]
    lines += ["#, fuzzy", 'msgid "Guessed"', 'msgstr "Geraten"', ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines), encoding="utf-8")


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest on one thread (and steadily when other jobs share the CPU)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
