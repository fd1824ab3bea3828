"""`specdec generate --draft DIR` and `specdec.load(..., draft=DIR)` with drafter folders in the published formats:
the greedy text is the target's own, a pickled head needs --allow-pickle, a mismatched head fails in one line."""

import json

import pytest

from drafters import format_checkpoints as fc
from specdec.cli import main


@pytest.fixture(scope="module")
def heads(ckpt, tmp_path_factory):
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(ckpt / "target", local_files_only=True)
    root = tmp_path_factory.mktemp("heads")
    return {"eagle": fc.write_eagle1(root / "eagle", target),
            "speculators": fc.write_speculators_eagle3(root / "spec", target, list(range(0, 64, 3)), layers=[0, 1]),
            "medusa": fc.write_medusa(root / "medusa", target, num_heads=2),
            "pickled": fc.write_eagle1(root / "pickled", target, weights="pytorch_model.bin")}


def cli(capsys, *argv):
    code = main(["generate", *argv])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


@pytest.mark.parametrize("name", ["eagle", "speculators", "medusa"])
def test_generate_with_a_head_folder_is_the_targets_text(capsys, ckpt, heads, name):
    base = ["--target", str(ckpt / "target"), "--prompt", "w1 w2 w3 w1 w2", "--prompt", "w4", "--temperature", "0",
            "--max-new-tokens", "12", "--json"]
    code, out, err = cli(capsys, *base)
    assert code == 0, err
    plain = json.loads(out.strip().splitlines()[-1])
    code, out, err = cli(capsys, *base, "--draft", str(heads[name]), "--num-draft-tokens", "3")
    assert code == 0, err
    spec = json.loads(out.strip().splitlines()[-1])
    assert spec["texts"] == plain["texts"] and spec["stats"]["alpha"] is not None  # (drafts were verified)


def test_a_pickled_head_needs_allow_pickle(capsys, ckpt, heads):
    base = ["--target", str(ckpt / "target"), "--prompt", "w1 w2", "--max-new-tokens", "4", "--temperature", "0",
            "--draft", str(heads["pickled"])]
    code, out, err = cli(capsys, *base)
    assert code == 2 and "allow_pickle=True" in err and len(err.strip().splitlines()) == 1
    code, out, err = cli(capsys, *base, "--allow-pickle")
    assert code == 0, err


def test_a_head_for_another_target_fails_in_one_line(capsys, ckpt, make_llama, tmp_path):
    folder = fc.write_medusa(tmp_path / "wide", make_llama(0, hidden=48))
    code, out, err = cli(capsys, "--target", str(ckpt / "target"), "--prompt", "w1", "--max-new-tokens", "4",
                         "--draft", str(folder))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "hidden size 48 and vocabulary 64; this target has hidden size 32 and vocabulary 64" in err



@pytest.mark.parametrize("name", ["speculators", "medusa"])
def test_load_with_a_head_folder_generates_the_targets_text(ckpt, heads, name):
    import specdec

    with specdec.load(ckpt / "target") as plain:
        expected = plain.generate("w1 w2 w3 w1 w2", max_new_tokens=12).token_ids
    with specdec.load(ckpt / "target", draft=heads[name], num_draft_tokens=3) as model:
        assert model.runner_kind == "engine"
        out = model.generate("w1 w2 w3 w1 w2", max_new_tokens=12)
    assert out.token_ids == expected and out.stats.num_draft_tokens > 0


def test_a_draft_with_its_own_tokenizer_drafts_over_the_shared_tokens(capsys, ckpt, make_llama, tmp_path):
    """--draft DIR / load(draft=DIR) with a model of another vocabulary: a CrossVocabDrafter, the target's text."""
    import specdec
    from drafters.test_formats_cross_vocab import tokenizer
    from helpers import WORDS

    other = tokenizer(["[UNK]", "[PAD]", "[BOS]", "[EOS]"] + WORDS[::-1][:40] + ["x1", "x2"])
    draft = make_llama(3, layers=1, vocab=len(other))
    draft.save_pretrained(tmp_path / "other")
    other.save_pretrained(tmp_path / "other")
    base = ["--target", str(ckpt / "target"), "--prompt", "w1 w2 w3 w1 w2", "--temperature", "0",
            "--max-new-tokens", "12", "--json"]
    code, out, err = cli(capsys, *base)
    plain = json.loads(out.strip().splitlines()[-1])
    code, out, err = cli(capsys, *base, "--draft", str(tmp_path / "other"), "--num-draft-tokens", "2")
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1])["texts"] == plain["texts"]
    with specdec.load(ckpt / "target", draft=tmp_path / "other", num_draft_tokens=2) as model:
        assert type(model.drafter).__name__ == "CrossVocabDrafter" and model.drafter.bridge.num_shared == 40
        assert model.generate("w1 w2 w3 w1 w2", max_new_tokens=12).text == plain["texts"][0]
