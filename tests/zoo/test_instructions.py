"""Prompts from local text (`specdec.zoo.instructions`) and the target's answers to them (`specdec.zoo.responses`)."""

import gzip

import numpy as np
import pytest
import torch

from helpers import hf_greedy
from specdec.zoo.instructions import DEMO_PROMPTS, build_prompts, man_summaries, stdlib_functions
from specdec.zoo.responses import Response, draft_vocabulary, generate_responses, response_data

MODULE = '''"""Tools for counting things."""


def count_words(text, sep=None):
    """Return the number of words in text.

    Words are separated by sep.
    """
    return len(text.split(sep))


def _private(x):
    """Not a prompt: private."""
    return x


class Counter:
    def total(self):
        """Return the sum of all counts."""
        return sum(self.counts)
'''


@pytest.fixture()
def local_text(tmp_path):
    lib = tmp_path / "lib"
    (lib / "tests").mkdir(parents=True)
    (lib / "counting.py").write_text(MODULE)
    (lib / "tests" / "test_x.py").write_text(MODULE)  # test folders are skipped
    (lib / "broken.py").write_text("def (:\n")  # unparsable files are skipped
    man = tmp_path / "man1"
    man.mkdir()
    with gzip.open(man / "ls.1.gz", "wt") as f:
        f.write('.TH LS 1\n.SH NAME\nls \\- list directory contents\n.SH SYNOPSIS\n')
    (man / "junk.1").write_text("no name section\n")
    return lib, man


def test_functions_modules_and_man_pages_are_read_without_importing(local_text):
    lib, man = local_text
    functions, modules = stdlib_functions(root=lib)
    assert [(f.module, f.name, f.summary) for f in functions] == [
        ("counting", "count_words", "Return the number of words in text."),
        ("counting", "total", "Return the sum of all counts.")]
    assert functions[0].signature == "count_words(text, sep=None)" and '"""' not in functions[0].bare_source
    assert modules == {"counting": "Tools for counting things."}
    assert man_summaries(man) == [("ls", "list directory contents")]
    assert man_summaries(man.parent / "missing") == []


def test_prompts_are_deterministic_distinct_and_never_the_demos(local_text):
    lib, man = local_text
    a = build_prompts(10_000, seed=3, stdlib_root=lib, man_folder=man)  # all there are
    b = build_prompts(10_000, seed=3, stdlib_root=lib, man_folder=man)
    assert a == b and len({p.text for p in a}) == len(a) and not set(DEMO_PROMPTS) & {p.text for p in a}
    kinds = {p.kind for p in a}
    assert {"write", "explain", "module", "command", "topic"} <= kinds
    assert "Write a Python function `count_words(text, sep=None)` that returns the number of words in text." \
        not in {p.text for p in a}  # summaries are lower-cased only when the rest of the word is
    assert any("count_words(text, sep=None)` that return the number of words" in p.text for p in a)
    code = sum(p.kind in ("write", "explain", "tests", "hints", "usage", "improve") for p in a)
    assert code == 12  # only 2 functions × 6 templates exist: the rest is chat
    with pytest.raises(ValueError, match="count"):
        build_prompts(0)
    with pytest.raises(ValueError, match="code_fraction"):
        build_prompts(5, code_fraction=1.5)


def test_responses_are_the_targets_greedy_answers_in_order(make_llama):
    target = make_llama(0)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [3], [7, 7, 2, 5]] * 2
    rows = generate_responses(target, prompts, max_new_tokens=10, eos_token_ids=[5], batch_size=2)
    assert [list(r.prompt_ids) for r in rows] == prompts
    for r in rows:
        assert list(r.response_ids) == hf_greedy(target, list(r.prompt_ids), 10, [5])
        assert r.finish_reason == ("stop" if r.response_ids[-1] == 5 else "length")
    assert generate_responses(target, prompts, max_new_tokens=4, eos_token_ids=[], max_seconds=0.0) == []


def test_response_data_and_draft_vocabulary():
    rows = [Response((1, 2), (3, 3, 3, 9), "stop"), Response((1,), (4, 3), "length"), Response((5, 6), (7,), "stop")]
    data = response_data(rows, val_fraction=0.34, seed=0)
    streams = sorted([data.train.tolist(), data.val.tolist()], key=len)
    assert data.train.dtype == np.uint16 and sum(map(len, streams)) == 2 + 4 + 1 + 2 + 2 + 1
    assert data.meta["rows"] == 3 and data.meta["val_rows"] == 1
    vocab = draft_vocabulary(rows, 2, always=(9,))
    assert vocab.token_ids.tolist() == [3, 9] and vocab.coverage == pytest.approx(5 / 7)
    assert draft_vocabulary(rows, 3).token_ids.tolist() == [3, 4, 7]  # ties: lower id first
    with pytest.raises(ValueError, match="uint16"):
        response_data([Response((70000,), (1,), "stop"), Response((1,), (2,), "stop")], val_fraction=0.5)
    with pytest.raises(ValueError, match="val_fraction"):
        response_data(rows, val_fraction=0.0)
    assert torch.is_tensor(vocab.token_ids)
