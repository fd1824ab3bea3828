from __future__ import annotations

import json
import shutil

import pytest

from specdec.zoo.catalogs import catalog_domain, find_catalogs, read_po
from specdec.zoo.corpus import EmptyCorpusError, code_documents, ende_pairs, read_mo, split_key, split_of
from specdec.zoo.data import TokenData, prepare_code_data, prepare_ende_data

from .conftest import write_mo


def test_code_documents_dedup_and_determinism(code_tree):
    docs = code_documents([code_tree], val_fraction=0.3)
    assert len(docs) == 30  # 31 .py files with content, one duplicate; empty file and .txt skipped
    assert len({d.sha256 for d in docs}) == len(docs)
    sources = [d.source for d in docs]
    assert any(s.endswith("pkg0/copy_of_mod3.py") for s in sources)  # first path in sorted order wins
    assert not any(s.endswith("pkg0/mod3.py") for s in sources)
    again = code_documents([code_tree], val_fraction=0.3)
    assert [(d.source, d.sha256, d.split) for d in docs] == [(d.source, d.sha256, d.split) for d in again]
    assert {d.split for d in docs} == {"train", "val"}


def test_split_is_by_file_content_not_location(code_tree, tmp_path):
    docs = {d.sha256: d.split for d in code_documents([code_tree], val_fraction=0.5)}
    moved = tmp_path / "elsewhere"
    shutil.copytree(code_tree, moved / "deeper")
    moved_docs = {d.sha256: d.split for d in code_documents([moved], val_fraction=0.5)}
    assert docs == moved_docs
    for d in code_documents([code_tree], val_fraction=0.5):
        assert d.split == split_of(d.sha256, 0.5)


def test_empty_and_missing_code_corpus(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(EmptyCorpusError, match="empty"):
        code_documents([tmp_path / "empty"])
    with pytest.raises(FileNotFoundError, match="no such folder"):
        code_documents([tmp_path / "missing"])


def test_prepare_code_data_is_deterministic_and_split_by_file(code_data, code_tree, tmp_path):
    meta = json.loads((code_data / "meta.json").read_text())
    again = prepare_code_data(tmp_path / "again", roots=[code_tree], vocab_size=320, val_fraction=0.2, progress=False)
    assert meta["train_sha256"] == again["train_sha256"] and meta["val_sha256"] == again["val_sha256"]
    data = TokenData.load(code_data)
    assert len(data.train) == meta["train_tokens"] > 0 and len(data.val) == meta["val_tokens"] > 0
    # validation text is exactly the validation files, each followed by </s>
    val_files = set(meta["val_sources"])
    tok = __import__("specdec.zoo.tokenizer", fromlist=["load_tokenizer"]).load_tokenizer(data.tokenizer_dir)
    val_text = tok.decode(data.val.tolist()).split("</s>")
    expected = sorted((d for d in code_documents([code_tree], val_fraction=0.2) if d.split == "val"),
                      key=lambda d: d.sha256)
    assert {d.source for d in expected} == val_files
    assert val_text[:-1] == [d.text for d in expected]


def test_read_mo_handles_header_context_plural_and_charset(locale_root):
    entries = dict(read_mo(locale_root / "de" / "LC_MESSAGES" / "prog0.mo"))
    assert "" not in entries
    assert entries["Save"] == "Speichern"
    assert entries["%d file"] == "%d Datei"
    assert entries["Quit"] == "Beenden"
    assert dict(read_mo(locale_root / "de_CH" / "LC_MESSAGES" / "latin.mo")) == {"Size": "Größe"}


def test_find_catalogs_mo_and_po_german_only(locale_root):
    files = find_catalogs([locale_root])
    names = [str(f.relative_to(locale_root)) for f in files]
    assert len(files) == 12, names  # 8 prog + latin + apt (.mo), django + de.po (.po)
    assert not any(n.startswith(("fr/", "de@hebrew/")) or n.endswith("fr.po") for n in names)
    assert "site/mod/locale/de.po" in names and catalog_domain(locale_root / "site/mod/locale/de.po") == "mod"
    assert catalog_domain(files[0]) == files[0].stem


def test_read_po_joins_lines_unescapes_and_skips_fuzzy(tmp_path):
    po = tmp_path / "x.po"
    po.write_text('msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n\n'
                  '#, c-format\nmsgctxt "menu"\nmsgid ""\n"Save \\"all\\" "\n"files"\n'
                  'msgstr "Alle \\"Dateien\\" speichern"\n'
                  '#, fuzzy\nmsgid "Close"\nmsgstr "Schließen?"\n\n'
                  'msgid "%d file"\nmsgid_plural "%d files"\nmsgstr[0] "%d Datei"\nmsgstr[1] "%d Dateien"\n\n'
                  '#~ msgid "Old"\n#~ msgstr "Alt"\n', encoding="utf-8")
    assert read_po(po) == [('Save "all" files', 'Alle "Dateien" speichern'), ("%d file", "%d Datei")]


def test_ende_pairs_splits(locale_root):
    pairs = ende_pairs(locale_roots=[locale_root], val_fraction=0.3)
    assert all(p.en != "%s" for p in pairs) and not any(p.en == "Guessed" for p in pairs)
    assert {"Add user", "Save record", "Size"} <= {p.en for p in pairs}
    splits: dict[str, set[str]] = {}
    for p in pairs:
        splits.setdefault(p.en, set()).add(p.split)
    assert all(len(s) == 1 for s in splits.values())  # no English message in two splits
    # the apt catalog is the out-of-domain set, whole: "Quit" (also in every prog catalog) goes with it, once
    assert sorted((p.en, p.split) for p in pairs if p.split == "ood") == [("Quit", "ood"), ("Remove package", "ood")]
    val = [p for p in pairs if p.split == "val"]
    assert len(val) == len({p.en for p in val}) and 0.15 < len(val) / len({p.en for p in pairs}) < 0.45
    assert {p.split for p in pairs} == {"train", "val", "ood"}
    assert ende_pairs(locale_roots=[locale_root], val_fraction=0.3) == pairs
    assert ende_pairs(locale_roots=[locale_root], val_fraction=0.3, seed=1) != pairs  # the seed picks the sample


def test_near_duplicates_share_a_split(tmp_path):
    """"Open file 7", "open file 7:" and "Open  file-7" differ only in case, spaces and punctuation."""
    mo = tmp_path / "de" / "LC_MESSAGES" / "x.mo"
    entries = {}
    for k in range(60):
        entries[f"Open file {k}".encode()] = f"Datei {k} öffnen".encode()
        entries[f"open file {k}:".encode()] = f"Datei {k} öffnen:".encode()
        entries[f"Open  file-{k}".encode()] = f"Datei-{k} öffnen".encode()
    write_mo(mo, entries)
    pairs = ende_pairs([mo], val_fraction=0.3)
    by_key: dict[str, set[str]] = {}
    for p in pairs:
        by_key.setdefault(split_key(p.en), set()).add(p.split)
    assert len(by_key) == 60 and all(len(s) == 1 for s in by_key.values())
    assert {p.split for p in pairs} == {"train", "val"}
    assert len([p for p in pairs if p.split == "val"]) == sum(s == {"val"} for s in by_key.values())  # one each


def test_length_filters(tmp_path):
    mo = tmp_path / "de" / "LC_MESSAGES" / "x.mo"
    long_de = "Jetzt die Datei wirklich ganz und gar und vollständig öffnen, bitte".encode()
    write_mo(mo, {b"Open the file now": long_de,
                  b"x" * 301 + b" a": b"y" * 301, b"Open": b"\xc3\x96ffnen"})
    assert [(p.en, p.de) for p in ende_pairs([mo], val_fraction=0.0)] == [("Open", "Öffnen")]


def test_shortcut_markers_are_removed_and_identifier_ids_dropped(tmp_path):
    mo = tmp_path / "de" / "LC_MESSAGES" / "x.mo"
    write_mo(mo, {b"Ma_ximize": "Ver_größern".encode(), b"&None": b"&Keine", b"~Move": b"~Verschieben",
                  b"Result: h_aliases=%s": b"Ergebnis: h_aliases=%s", b"Drag & Drop": b"Ziehen & Ablegen",
                  b"box_sign_in": b"Anmelden"})
    assert sorted((p.en, p.de) for p in ende_pairs([mo], val_fraction=0.0)) == [
        ("Drag & Drop", "Ziehen & Ablegen"), ("Maximize", "Vergrößern"), ("Move", "Verschieben"), ("None", "Keine"),
        ("Result: h_aliases=%s", "Ergebnis: h_aliases=%s")]


def test_empty_ende_corpus(tmp_path):
    with pytest.raises(EmptyCorpusError, match="no German .mo/.po catalogs"):
        ende_pairs(locale_roots=[tmp_path])


def test_prepare_ende_data(locale_root, tmp_path):
    meta = prepare_ende_data(tmp_path / "ende", locale_roots=[locale_root], vocab_size=300, val_fraction=0.3)
    assert meta["train_pairs"] > 0 and meta["val_pairs"] > 0 and meta["ood_pairs"] == 2
    assert meta["ood_catalogs"] == ["apt.mo"]
    from specdec.zoo.data import PairData

    data = PairData.load(tmp_path / "ende")
    assert len(data.train) == meta["train_pairs"] and len(data.val) == meta["val_pairs"] and len(data.ood) == 2
    src, tgt = data.train[0]
    assert src[-1] == 2 and tgt[-1] == 2  # </s> appended
    batch = PairData.collate(data.train[:4])
    assert batch.input_ids.shape == batch.attention_mask.shape and (batch.labels[batch.labels >= 0] >= 0).all()
