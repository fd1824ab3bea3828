"""A draft-length policy as the text API's default γ under tensor parallelism, on 2 gloo CPU ranks: every rank
builds its own policy, and every rank runs rank 0's choice (`engine.agreement`, as for "auto")."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

WORKER = Path(__file__).with_name("tp_text_worker.py")


def _helpers():
    sys.path.insert(0, str(WORKER.parent))
    try:
        from test_tensor_parallel import _torchrun, specdec_load
    finally:
        sys.path.remove(str(WORKER.parent))
    return _torchrun, specdec_load


@pytest.fixture(scope="module")
def checkpoints(ckpt):
    """conftest's tiny pair: a 2-layer Llama (seed 0) and a 1-layer draft (seed 1)."""
    return {"llama": str(ckpt / "target"), "draft": str(ckpt / "draft")}


def test_text_api_tensor_parallel_runs_rank_zeros_policy_choice(checkpoints, tmp_path):
    """A draft-length policy object as the default γ under TP (`text.tensor_parallel.check_gamma`): each rank builds
    its own, and they choose apart (rank 0: 1, 2, 3, ...; rank 1: always 4). Every rank runs rank 0's choice
    (`engine.agreement`): the draft lengths rank 1's steps ran are rank 0's, never its own 4 (the negative control:
    its own choice was not what ran), and the greedy texts are one process's."""
    _torchrun, specdec_load = _helpers()
    out = tmp_path / "policy.json"
    _torchrun(str(WORKER), str(out), checkpoints["llama"], checkpoints["draft"], "policy")
    got, follower = json.loads(out.read_text()), json.loads(Path(f"{out}.rank1").read_text())
    assert got["asked"] and set(got["asked"]) - {0} <= {1, 2, 3} and len(set(got["asked"])) > 1
    assert follower["asks"] == len(got["ran"]) and follower["ran"] == got["ran"]  # every step: rank 0's γ
    assert max(follower["ran"]) <= 3  # (rank 1 asked 4 every step)
    with specdec_load(checkpoints) as llm:
        prompts = ["w1 w2 w3 w4", "w5 w6", "w7 w7 w8 w9 w7"]
        assert got["greedy"] == [c.text for c in llm.generate(prompts, max_new_tokens=12, temperature=0)]


def test_cli_torchrun_runs_a_policy_name_with_the_single_process_text(checkpoints, capsys):
    """`generate --tensor-parallel-size 2 --num-draft-tokens optimal`: the optimal policy times each rank's own steps
    (so the ranks' choices may differ); every rank runs rank 0's, and rank 0 prints the single-process greedy text.
    Negative control: a name that is no policy is still refused, in one line."""
    from specdec.cli import main

    _torchrun, _ = _helpers()
    common = ["--device", "cpu", "--target", checkpoints["llama"], "--draft", checkpoints["draft"],
              "--prompt", "w1 w2 w3 w4", "--temperature", "0", "--max-new-tokens", "10", "--quiet",
              "--num-draft-tokens", "optimal"]
    proc = _torchrun("-m", "specdec", "generate", "--tensor-parallel-size", "2", *common)
    assert main(["generate", *common]) == 0
    single = capsys.readouterr().out
    assert len(single.split()) > 4 and proc.stdout == single
    assert main(["generate", *common[:-1], "optimall", "--tensor-parallel-size", "2"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
