from __future__ import annotations

import json
import shutil

import pytest

from specdec.zoo.corpus import EmptyCorpusError, code_documents, ende_pairs, find_mo_files, read_mo, split_of
from specdec.zoo.data import TokenData, prepare_code_data, prepare_ende_data


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


def test_ende_pairs_dedup_split_by_catalog(locale_root):
    files = find_mo_files([locale_root])
    assert len(files) == 9 and all("/fr/" not in str(f) for f in files)
    pairs = ende_pairs(files, val_fraction=0.3)
    assert sum(p.en == "Quit" for p in pairs) == 1
    assert all(p.en != "%s" for p in pairs)
    by_file: dict[str, set[str]] = {}
    for p in pairs:
        by_file.setdefault(p.source, set()).add(p.split)
    assert all(len(s) == 1 for s in by_file.values())  # no catalog straddles the splits
    assert {p.split for p in pairs} == {"train", "val"}
    assert ende_pairs(files, val_fraction=0.3) == pairs


def test_empty_ende_corpus(tmp_path):
    with pytest.raises(EmptyCorpusError, match="no .mo catalogs"):
        ende_pairs(locale_roots=[tmp_path])


def test_prepare_ende_data(locale_root, tmp_path):
    meta = prepare_ende_data(tmp_path / "ende", locale_roots=[locale_root], vocab_size=300, val_fraction=0.3)
    assert meta["train_pairs"] > 0 and meta["val_pairs"] > 0
    from specdec.zoo.data import PairData

    data = PairData.load(tmp_path / "ende")
    src, tgt = data.train[0]
    assert src[-1] == 2 and tgt[-1] == 2  # </s> appended
    batch = PairData.collate(data.train[:4])
    assert batch.input_ids.shape == batch.attention_mask.shape and (batch.labels[batch.labels >= 0] >= 0).all()
