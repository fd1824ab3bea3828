"""Tensor parallelism on CPU: 2 and 4 gloo ranks under torchrun give the single-process tokens exactly (fp32).

Launches of ~10-30 s each on 2 cores: the library on a tiny Llama and a tied Qwen2 with q/k/v biases (greedy and
seeded sampling, with a model drafter replicated on every rank) at TP 2, a Llama with 4 kv heads at TP 4, and the
CLI `torchrun -m specdec generate`. GPU-marked variants run the same on 2 and 4 GPUs, with NCCL and with the
symmetric-memory one-shot all-reduce.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import save_tiny_checkpoint
from specdec.cli import main
from specdec.distributed import shard_shape
from specdec.fast.model import FastLlama, LlamaShape

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("tp_worker.py")
TIMEOUT_S = 180


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    base = tmp_path_factory.mktemp("tp")
    save_tiny_checkpoint(base / "llama", seed=0)
    save_tiny_checkpoint(base / "draft", seed=1, layers=1)
    torch.manual_seed(2)
    config = transformers.Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                      use_sliding_window=False, tie_word_embeddings=True)
    qwen = transformers.Qwen2ForCausalLM(config)
    with torch.no_grad():
        for name, p in qwen.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.1)  # the q/k/v biases are sharded with their heads: make them matter
        qwen.lm_head.weight.mul_(10.0)
    qwen.save_pretrained(base / "qwen", max_shard_size="50KB")  # several files + model.safetensors.index.json
    torch.manual_seed(3)  # 4 kv heads: shards over 4 ranks (one kv head each)
    wide = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=256))
    with torch.no_grad():
        wide.lm_head.weight.mul_(10.0)
    wide.save_pretrained(base / "llama4")
    return {name: str(base / name) for name in ("llama", "draft", "qwen", "llama4")}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun_command(*args: str, env_extra: dict | None = None, nproc: int = 2,
                     launcher: tuple[str, ...] = ()) -> tuple[list[str], dict]:
    """(command, environment) of `torchrun --nproc-per-node nproc [launcher options] args...` on a free local port,
    this checkout first on the path, one thread per rank, no rendezvous variables inherited."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    env.update(env_extra or {})
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--nnodes", "1",
           "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), *launcher, *args]
    return cmd, env


def _torchrun(*args: str, env_extra: dict | None = None, nproc: int = 2) -> subprocess.CompletedProcess:
    cmd, env = torchrun_command(*args, env_extra=env_extra, nproc=nproc)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _ranks_match_one_process(checkpoints, tmp_path, device: str, *, world: int = 2, all_reduce: str = "auto",
                             targets=("llama", "qwen")) -> dict:
    """`world` ranks (sharded target, replicated drafter) give one process's fp32 tokens; returns the results."""
    sys.path.insert(0, str(WORKER.parent))
    try:
        from tp_worker import run
    finally:
        sys.path.remove(str(WORKER.parent))
    out = tmp_path / "out.json"
    targets = [checkpoints[name] for name in targets]
    _torchrun(str(WORKER), str(out), *targets, checkpoints["draft"], nproc=world,
              env_extra={"TP_DEVICE": device, "TP_ALL_REDUCE": all_reduce})
    got = json.loads(out.read_text())
    assert got["ranks_agree"]
    assert got["clean_shutdown"]  # engines released, then the group destroyed within its deadline
    drafter = transformers.AutoModelForCausalLM.from_pretrained(checkpoints["draft"]).eval().to(device)
    for folder in targets:
        ref = run(FastLlama.from_hf(folder, device=device, dtype=torch.float32), drafter)
        assert got["results"][folder]["kv_heads"] == 1  # each rank holds 1 kv head (and caches only it)
        assert got["results"][folder]["shard_model_same"]
        assert got["results"][folder]["greedy"] == ref["greedy"], folder
        assert got["results"][folder]["sampled"] == ref["sampled"], folder
        assert len({tuple(s) for s in ref["greedy"] + ref["sampled"]}) > 3  # not one degenerate sequence
    return got


def _two_ranks_match_one_process(checkpoints, tmp_path, device: str, all_reduce: str = "auto") -> None:
    got = _ranks_match_one_process(checkpoints, tmp_path, device, all_reduce=all_reduce)
    # untied Llama: a vocab-parallel head (32 of the 64 rows, logits gathered); tied Qwen2: the replicated embedding
    assert [got["results"][checkpoints[name]]["head_rows"] for name in ("llama", "qwen")] == [32, False]


def test_two_ranks_match_one_process(checkpoints, tmp_path):
    _two_ranks_match_one_process(checkpoints, tmp_path, "cpu")


def test_four_ranks_match_one_process(checkpoints, tmp_path):
    got = _ranks_match_one_process(checkpoints, tmp_path, "cpu", world=4, targets=("llama4",))
    assert got["results"][checkpoints["llama4"]]["head_rows"] == 16  # 64 vocabulary rows over 4 ranks


two_gpus = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                              reason="needs 2 CUDA devices")


@pytest.mark.gpu
@two_gpus
def test_two_gpus_nccl_match_one_process_and_exit_cleanly(checkpoints, tmp_path):
    """NCCL with the engine's CUDA graphs (all-reduces captured): fp32 tokens equal one process's on one GPU,
    every rank agrees, and the group shuts down within its deadline (the wave-2 path hung here at exit)."""
    _two_ranks_match_one_process(checkpoints, tmp_path, "cuda", all_reduce="group")


@pytest.mark.gpu
@two_gpus
def test_two_gpus_one_shot_all_reduce_match_one_process(checkpoints, tmp_path):
    """The symmetric-memory one-shot all-reduce (fp32, captured in the engine's graphs) gives the same tokens."""
    _two_ranks_match_one_process(checkpoints, tmp_path, "cuda", all_reduce="one_shot")


four_gpus = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 4,
                               reason="needs 4 CUDA devices")


@pytest.mark.gpu
@four_gpus
@pytest.mark.parametrize("all_reduce", ["group", "one_shot", "auto"])
def test_four_gpus_match_one_process(checkpoints, tmp_path, all_reduce):
    got = _ranks_match_one_process(checkpoints, tmp_path, "cuda", world=4, all_reduce=all_reduce, targets=("llama4",))
    assert got["results"][checkpoints["llama4"]]["head_rows"] == 16


@pytest.mark.gpu
@two_gpus
def test_two_gpus_cli_torchrun_exits(checkpoints, capsys):
    common = ["--device", "cuda", "--dtype", "float32", "--target", checkpoints["llama"], "--draft",
              checkpoints["draft"], "--prompt", "w1 w2 w3 w4", "--temperature", "0", "--max-new-tokens", "10", "--quiet"]
    proc = _torchrun("-m", "specdec", "generate", "--tensor-parallel-size", "2", *common)  # asserts exit 0 in time
    assert main(["generate", *common]) == 0
    assert proc.stdout == capsys.readouterr().out


def test_cli_torchrun_prints_the_single_process_text(checkpoints, capsys):
    common = ["--device", "cpu", "--target", checkpoints["llama"], "--draft", checkpoints["draft"],
              "--prompt", "w1 w2 w3 w4", "--temperature", "0", "--max-new-tokens", "10", "--quiet"]
    proc = _torchrun("-m", "specdec", "generate", "--tensor-parallel-size", "2", *common)
    assert main(["generate", *common]) == 0
    single = capsys.readouterr().out
    assert len(single.split()) > 4
    assert proc.stdout == single  # rank 0 alone prints, the same text


def test_cli_refuses_without_torchrun_or_wrong_world_size(checkpoints, capsys, monkeypatch):
    args = ["generate", "--device", "cpu", "--target", checkpoints["llama"], "--prompt", "w1", "--tensor-parallel-size"]
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR"):
        monkeypatch.delenv(name, raising=False)
    assert main([*args, "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "torchrun --nproc-per-node 2" in err
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    assert main([*args, "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "world size (4)" in err
    assert main([*args, "0"]) == 2
    assert "--tensor-parallel-size must be >= 1" in capsys.readouterr().err
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR"):
        monkeypatch.delenv(name)
    assert main([*args[:-1], "--tensor-parallel-all-reduce", "one_shot"]) == 2  # without --tensor-parallel-size
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--tensor-parallel-all-reduce one_shot needs --tensor-parallel-size > 1" in err
    assert main(["serve", "--target", checkpoints["llama"], "--tensor-parallel-all-reduce", "one_shot"]) == 2
    assert "--tensor-parallel-all-reduce one_shot needs --tensor-parallel-size > 1" in capsys.readouterr().err


def test_shard_shape_splits_heads_and_refuses_what_does_not_divide():
    shape = LlamaShape(vocab_size=64, dim=32, n_layers=2, n_heads=8, n_kv_heads=2, head_dim=4, intermediate_size=96)
    two = shard_shape(shape, 2)
    assert (two.n_heads, two.n_kv_heads, two.intermediate_size, two.vocab_size) == (4, 1, 48, 64)
    with pytest.raises(ValueError, match=r"tensor_parallel_size 4 must divide the model's key/value heads \(2\)"):
        shard_shape(shape, 4)
    with pytest.raises(ValueError, match="intermediate_size"):
        shard_shape(LlamaShape(64, 32, 2, n_heads=4, n_kv_heads=4, head_dim=8, intermediate_size=90), 4)
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        shard_shape(shape, 0)


@pytest.mark.parametrize("family", ["llama3", "mistral", "qwen3"])
def test_rope_tables_come_from_the_config_as_transformers_computes_them(family):
    from specdec.distributed.sharded import _rope

    small = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=256)
    if family == "llama3":
        config = transformers.LlamaConfig(**small, rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                                 "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                                 "original_max_position_embeddings": 64})
        model = transformers.LlamaForCausalLM(config)
    elif family == "mistral":
        model = transformers.MistralForCausalLM(transformers.MistralConfig(**small, sliding_window=None))
    else:
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**small, head_dim=8))
    inv_freq, scaling = _rope(model.config)
    assert torch.equal(inv_freq, model.model.rotary_emb.inv_freq)
    assert scaling == model.model.rotary_emb.attention_scaling


def test_fixture_qwen_is_sharded_over_files(checkpoints):
    files = list(Path(checkpoints["qwen"]).glob("model-*.safetensors"))
    assert len(files) > 1 and (Path(checkpoints["qwen"]) / "model.safetensors.index.json").is_file()


def test_shutdown_releases_cached_engines_without_a_group(checkpoints):
    """The teardown drops the engines `specdec.generate` cached on a model (their graphs hold the captured
    collectives) and is a no-op success when no process group runs."""
    import specdec
    from specdec.distributed import shutdown_tensor_parallel

    model = FastLlama.from_hf(checkpoints["llama"])
    specdec.generate(model, [[1, 2, 3]], max_new_tokens=2, temperature=0.0, engine="fast")
    assert model.__dict__.get("_specdec_engines")
    assert shutdown_tensor_parallel(model) is True
    assert "_specdec_engines" not in model.__dict__ and "_specdec_fast_models" not in model.__dict__


def test_text_api_tensor_parallel_matches_one_process(checkpoints, tmp_path):
    """`specdec.load(..., tensor_parallel_size=2)`: rank 0 serves (batches, a stream, a second γ created after
    start-up, "auto" requests, a request without a seed), rank 1 follows its commands and exits when rank 0 closes the LLM; the
    texts are the single-process ones."""
    out = tmp_path / "text.json"
    _torchrun(str(WORKER.with_name("tp_text_worker.py")), str(out), checkpoints["llama"], checkpoints["draft"])
    got = json.loads(out.read_text())
    prompts = ["w1 w2 w3 w4", "w5 w6", "w7 w7 w8 w9 w7"]
    with specdec_load(checkpoints) as llm:
        assert got["greedy"] == [c.text for c in llm.generate(prompts, max_new_tokens=12, temperature=0)]
        assert got["sampled"] == [c.text for c in llm.generate(prompts, max_new_tokens=12, temperature=1.0, seed=5)]
        assert got["streamed"] == got["greedy"][0]
        assert got["other_gamma"] == got["greedy"][1]
        assert got["auto_gamma"] == got["greedy"]  # ("auto": rank 0's choice each step, `engine.agreement`)
    # (its seed is drawn fresh: its text is not known, only that it ended honestly — at the budget or at an EOS —
    # on every rank: ranks that sampled apart would have stepped apart and failed the launch)
    unseeded = got["unseeded"]
    assert (unseeded["finish_reason"], unseeded["tokens"]) == ("length", 12) or (
        unseeded["finish_reason"] == "stop" and 1 <= unseeded["tokens"] <= 12), unseeded
    assert len(set(got["greedy"] + got["sampled"])) > 3  # not one degenerate text


def specdec_load(checkpoints):
    import specdec

    return specdec.load(checkpoints["llama"], checkpoints["draft"], device="cpu", num_draft_tokens=3)


def test_text_api_tensor_parallel_refuses_model_objects(checkpoints, monkeypatch):
    import specdec

    with pytest.raises(ValueError, match="torchrun"):  # (a policy is taken: rank 0's choice runs on every rank)
        specdec.load(checkpoints["llama"], checkpoints["draft"], num_draft_tokens="heuristic", tensor_parallel_size=2)
    with pytest.raises(ValueError, match="torchrun"):  # ("auto" is taken: rank 0's choice runs on every rank)
        specdec.load(checkpoints["llama"], checkpoints["draft"], num_draft_tokens="auto", tensor_parallel_size=2)
    with pytest.raises(ValueError, match="torchrun"):
        specdec.load(checkpoints["llama"], checkpoints["draft"], num_draft_tokens=3, tensor_parallel_size=2)
    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoints["llama"])
    with pytest.raises(ValueError, match="safetensors folder"):
        specdec.load(model, tokenizer=checkpoints["llama"], num_draft_tokens=0, tensor_parallel_size=2)
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        specdec.load(checkpoints["llama"], tensor_parallel_size=0)
    with pytest.raises(ValueError, match="tensor_parallel_all_reduce='one_shot' needs tensor_parallel_size > 1"):
        specdec.load(checkpoints["llama"], tensor_parallel_all_reduce="one_shot")
    with pytest.raises(ValueError, match="all_reduce must be one of"):
        specdec.load(checkpoints["llama"], tensor_parallel_all_reduce="nccl", tensor_parallel_size=2)


def _serve_tensor_parallel(checkpoints, device: str) -> None:
    """`torchrun ... specdec serve --tensor-parallel-size 2`: rank 0 answers HTTP with the single-process text,
    rank 1 follows; on SIGTERM (what torchrun forwards on Ctrl-C) every process exits."""
    import signal
    import time

    import httpx

    http_port = _free_port()
    cmd, env = torchrun_command("-m", "specdec", "serve", "--tensor-parallel-size", "2", "--target",
                                checkpoints["llama"], "--draft", checkpoints["draft"], "--device", device, "--dtype",
                                "float32", "--num-draft-tokens", "3", "--port", str(http_port), "--quiet")
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        url = f"http://127.0.0.1:{http_port}"
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the tensor-parallel server did not come up"
            time.sleep(0.5)
        texts = []
        for body in ({"prompt": "w1 w2 w3 w4", "max_tokens": 10, "temperature": 0},
                     {"prompt": "w5 w6", "max_tokens": 10, "temperature": 0, "num_draft_tokens": 0},
                     {"prompt": "w5 w6", "max_tokens": 10, "temperature": 1.0, "seed": 3}):
            reply = httpx.post(url + "/v1/completions", json={"model": Path(checkpoints["llama"]).name, **body},
                               timeout=60)
            assert reply.status_code == 200, reply.text
            texts.append(reply.json()["choices"][0]["text"])
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError("the tensor-parallel server did not exit within 60 s of SIGTERM")
    import specdec

    with specdec.load(checkpoints["llama"], checkpoints["draft"], device=device, dtype="float32",
                      num_draft_tokens=3) as llm:
        assert texts[0] == llm.generate("w1 w2 w3 w4", max_new_tokens=10, temperature=0).text
        assert texts[1] == llm.generate("w5 w6", max_new_tokens=10, temperature=0, num_draft_tokens=0).text
        assert texts[2] == llm.generate("w5 w6", max_new_tokens=10, temperature=1.0, seed=3).text


def test_serve_tensor_parallel_answers_and_exits(checkpoints):
    pytest.importorskip("fastapi")
    _serve_tensor_parallel(checkpoints, "cpu")


@pytest.mark.gpu
@two_gpus
def test_two_gpus_serve_tensor_parallel_answers_and_exits(checkpoints):
    pytest.importorskip("fastapi")
    _serve_tensor_parallel(checkpoints, "cuda")


# ---------------------------------------------------------------- scripts/tp_probe.py (what the GPU runs measure)
def test_probe_rows_on_two_cpu_ranks(tmp_path):
    out = tmp_path / "probe.jsonl"
    proc = _torchrun(str(ROOT / "scripts" / "tp_probe.py"), "--shape", "tiny", "--device", "cpu", "--batch", "1", "3",
                     "--new", "12", "--prompt-len", "6", "--spec-alpha", "0.8", "--draft-shape", "tiny-draft",
                     "--gamma", "2", "4",
                     "--comm-bench", "--out", str(out))
    rows = [json.loads(line) for line in Path(out).read_text().splitlines()]
    assert proc.stdout.count('"row": "teardown"') == 1  # rank 0 alone prints
    by = {}
    for row in rows:
        assert "error" not in row, row
        assert row["tp"] == 2
        by.setdefault(row["row"], []).append(row)
    assert [r["batch"] for r in by["plain"]] == [1, 3]
    for row in by["plain"] + by["spec"]:
        assert row["ranks_agree"] is True and row["tok_per_s"] > 0
    assert by["plain"][0]["steps_per_s"] == by["plain"][0]["tok_per_s"]
    assert by["plain"][0]["mbu"] is None  # no bandwidth figure for a CPU
    assert [(r["gamma"], r["draft_shape"]) for r in by["spec"]] == [(2, "tiny-draft"), (4, "tiny-draft")]
    spec = by["spec"][1]
    assert spec["batch"] == 1 and spec["alpha"] == 0.8
    assert 0.5 < spec["alpha_measured"] < 1.0  # synthetic acceptance, drawn per position
    assert spec["c"] > 0 and spec["thm38_speedup"] > 1.0
    assert abs(spec["thm38_tok_per_s"] - spec["plain_tok_per_s"] * spec["thm38_speedup"]) < 0.2
    assert {(r["rows"], r["all_reduce"]) for r in by["comm"]} == {(1, "group"), (5, "group"), (64, "group")}
    assert by["teardown"] == [by["teardown"][0]] and by["teardown"][0]["clean"] is True
