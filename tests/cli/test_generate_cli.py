"""`specdec generate` on tiny checkpoints saved to disk."""

import json

import pytest

from specdec.cli import main


def cli(capsys, *argv):
    code = main(["generate", *argv])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


@pytest.mark.parametrize("draft", [None, "draft", "ngram", "unigram", "prompt-lookup"])
def test_greedy_text_is_identical_for_every_drafter(capsys, ckpt, draft):
    base = ["--target", str(ckpt / "target"), "--prompt", "w1 w2 w3 w1 w2", "--temperature", "0",
            "--max-new-tokens", "12", "--json"]
    code, out, err = cli(capsys, *base)
    assert code == 0, err
    plain = json.loads(out.strip().splitlines()[-1])
    extra = [] if draft is None else ["--draft", str(ckpt / "draft") if draft == "draft" else draft]
    code, out, err = cli(capsys, *base, *extra)
    assert code == 0, err
    spec = json.loads(out.strip().splitlines()[-1])
    assert spec["sequences"] == plain["sequences"] and spec["texts"] == plain["texts"]
    assert spec["stats"]["mean_accepted_length"] >= 1.0


def test_streams_text_then_stats(capsys, ckpt):
    code, out, err = cli(capsys, "--target", str(ckpt / "target"), "--draft", str(ckpt / "draft"),
                         "--prompt", "w1 w2", "--max-new-tokens", "8", "--seed", "0")
    assert code == 0, err
    lines = out.strip().splitlines()
    assert lines[0].startswith("w1 w2") and "α=" not in out  # the text on stdout, the stats on stderr
    assert "α=" in err and "τ=" in err and "tokens/s=" in err
    code, out, quiet = cli(capsys, "--target", str(ckpt / "target"), "--prompt", "w1 w2", "--max-new-tokens", "4",
                           "--quiet")
    assert code == 0 and quiet == "" and out.startswith("w1 w2")


def test_batch_of_prompts(capsys, ckpt):
    code, out, err = cli(capsys, "--target", str(ckpt / "target"), "--draft", "prompt-lookup", "--prompt", "w1 w2",
                         "--prompt", "w3 w4 w5 w3 w4", "--temperature", "0", "--max-new-tokens", "5", "--json")
    assert code == 0, err
    assert len(json.loads(out.strip().splitlines()[-1])["texts"]) == 2


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--target", "/nonexistent/dir", "--prompt", "w1"], "not found"),
        (["--draft", "/nonexistent/draft", "--prompt", "w1"], "not found"),
        (["--prompt", "w1", "--top-p", "0"], "top_p"),
        (["--prompt", "w1", "--temperature", "-1"], "temperature"),
        (["--prompt", "w1", "--num-draft-tokens", "0", "--draft", "ngram"], "num_draft_tokens"),
        (["--prompt", "w1", "--draft", "ngram", "--ngram-data", "/nonexistent.txt"], "not found"),
    ],
)
def test_bad_input_is_one_line_and_nonzero(capsys, ckpt, argv, fragment):
    if "--target" not in argv:
        argv = ["--target", str(ckpt / "target"), *argv]
    code, out, err = cli(capsys, *argv)
    assert code == 2
    assert fragment in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_encoder_decoder_checkpoint_is_detected(capsys, tmp_path):
    import torch
    import transformers

    from helpers import WORDS, save_tiny_checkpoint

    save_tiny_checkpoint(tmp_path / "tok", seed=0)  # reuse its word-level tokenizer
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "tok")
    config = transformers.T5Config(
        vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
        decoder_start_token_id=tokenizer.pad_token_id, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(config)
    model.save_pretrained(tmp_path / "t5")
    tokenizer.save_pretrained(tmp_path / "t5")
    prompt = " ".join(WORDS[:6])
    code, out, err = cli(capsys, "--target", str(tmp_path / "t5"), "--draft", str(tmp_path / "t5"), "--prompt", prompt,
                         "--temperature", "0", "--max-new-tokens", "8", "--json")
    assert code == 0, err
    spec = json.loads(out.strip().splitlines()[-1])
    ids = tokenizer(prompt, return_tensors="pt")
    ref = model.generate(**ids, do_sample=False, max_new_tokens=8)[0, 1:].tolist()
    eos = tokenizer.eos_token_id
    ref = ref[: ref.index(eos) + 1] if eos in ref else ref
    assert spec["sequences"][0] == ref
    assert spec["stats"]["alpha"] == pytest.approx(1.0)
