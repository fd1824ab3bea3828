"""CLI of the extensions on tiny checkpoints: `specdec beam`, `generate --draft-tree`, `generate --leniency`."""

import json

import pytest

from specdec.cli import main


def last_json(capsys, *argv):
    code = main(list(argv))
    cap = capsys.readouterr()
    assert code == 0, cap.err
    return json.loads(cap.out.strip().splitlines()[-1])


def test_beam_with_a_draft_gives_the_plain_beams(capsys, ckpt):
    base = ["beam", "--target", str(ckpt / "target"), "--prompt", "w1 w2 w3", "--num-beams", "3",
            "--max-new-tokens", "6", "--no-eos", "--json"]
    plain = last_json(capsys, *base)
    spec = last_json(capsys, *base, "--draft", str(ckpt / "draft"), "--draft-beams", "6", "--num-draft-tokens", "2")
    assert spec["sequences"] == plain["sequences"] and len(spec["sequences"][0]) == 3
    assert spec["scores"][0] == pytest.approx(plain["scores"][0], abs=1e-4)
    assert spec["stats"]["drafter_calls"] > 0
    fast = last_json(capsys, *base, "--draft", str(ckpt / "draft"), "--draft-beams", "6", "--num-draft-tokens", "2",
                     "--engine", "fast")  # the engine's beam groups: the same beams
    assert fast["sequences"] == plain["sequences"]
    assert fast["scores"][0] == pytest.approx(plain["scores"][0], abs=1e-4)


def test_generate_draft_tree_and_leniency(capsys, ckpt):
    base = ["generate", "--target", str(ckpt / "target"), "--prompt", "w1 w2 w3 w1 w2", "--temperature", "0",
            "--max-new-tokens", "8", "--json"]
    plain = last_json(capsys, *base)
    tree = last_json(capsys, *base, "--draft", str(ckpt / "draft"), "--draft-tree", "2,2,1")
    assert tree["sequences"] == plain["sequences"]
    lenient = last_json(capsys, *base, "--draft", str(ckpt / "draft"), "--leniency", "0.5")
    assert len(lenient["sequences"][0]) == 8


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["generate", "--draft-tree", "2,x", "--draft", "DRAFT"], "--draft-tree"),
        (["generate", "--leniency", "1.5", "--draft", "DRAFT"], "leniency"),
        (["beam", "--num-beams", "0"], "num_beams"),
        (["beam", "--num-beams", "2", "--draft-beams", "1", "--draft", "DRAFT"], "draft_beams"),
    ],
)
def test_errors_are_one_line(capsys, ckpt, argv, fragment):
    argv = [str(ckpt / "draft") if a == "DRAFT" else a for a in argv]
    code = main([argv[0], "--target", str(ckpt / "target"), "--prompt", "w1 w2", *argv[1:]])
    err = capsys.readouterr().err
    assert code == 2 and fragment in err and "Traceback" not in err
