"""text/drafts.py: the one drafter loader that `specdec.load` and the CLI's --draft share."""

from __future__ import annotations

import pytest

import specdec
from specdec.text.drafts import NGRAM_ORDERS, draft_checkpoint, load_draft, named_draft


def test_named_drafts_and_their_orders() -> None:
    assert isinstance(named_draft("prompt-lookup"), specdec.PromptLookupDrafter)
    for name, order in NGRAM_ORDERS.items():
        drafter = named_draft(name, [[1, 2, 3, 2, 1]], 16)
        assert isinstance(drafter, specdec.NGramDrafter)
        assert (drafter.order, drafter.vocab_size) == (order, 16)


def test_a_head_folder_refuses_model_options_naming_the_option(tmp_path) -> None:
    folder = tmp_path / "medusa"
    folder.mkdir()
    (folder / "config.json").write_text('{"medusa_num_heads": 2, "medusa_num_layers": 1}')
    with pytest.raises(ValueError, match="--draft-model-option applies to draft models, not to head folders"):
        draft_checkpoint(folder, None, 16, device="cpu", dtype=None, allow_pickle=False,
                         model_kwargs={"revision": "x"}, option="--draft-model-option")


def test_load_draft_names_and_objects() -> None:
    class Target:
        device = "cpu"

    drafter = specdec.PromptLookupDrafter()
    assert load_draft(None, Target(), None, False, None) is None
    assert load_draft(drafter, Target(), None, False, None) is drafter  # a drafter object passes through
    with pytest.raises(ValueError, match="needs ngram_data"):
        load_draft("ngram", Target(), None, False, None)
    with pytest.raises(ValueError, match="draft_model_kwargs apply when draft is a checkpoint"):
        load_draft("prompt-lookup", Target(), None, False, None, draft_model_kwargs={})
