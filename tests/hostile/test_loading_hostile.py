"""specdec.loading on hostile folders: refused before transformers runs anything, with the folder named."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from specdec.loading import inspect_checkpoint, load_model, load_tokenizer, resolve_device, resolve_dtype


@pytest.mark.parametrize("name, error, fragment", [
    ("evil", ValueError, "custom code"),
    ("automap", ValueError, "custom code"),
    ("traversal", ValueError, "outside the checkpoint folder"),
    ("truncated", ValueError, "truncated"),
    ("corrupt", ValueError, "not a valid safetensors"),
    ("vocab0", ValueError, "vocab_size"),
    ("pickle", ValueError, "allow_pickle"),
])
def test_refused_with_a_named_reason(checkpoints, monkeypatch, name, error, fragment):
    import transformers

    def never(*args, **kwargs):
        raise AssertionError("transformers was asked to load the weights")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", never)
    with pytest.raises(error, match=fragment) as info:
        load_model(checkpoints[name], what="target")
    assert str(info.value).startswith("target")
    assert not checkpoints["marker"].exists()


def test_sliding_window_checkpoint_loads_for_the_engine(checkpoints):
    """The engine rolls sliding windows back, so loading no longer refuses them (the transformers loop still does,
    naming the engine: tests/hostile/test_api_hostile.py)."""
    model = load_model(checkpoints["mistral"], device="cpu")
    assert model.config.sliding_window == 8


def test_good_and_opted_in_pickle_load(checkpoints):
    good = load_model(checkpoints["good"], device="cpu")
    pickled = load_model(checkpoints["pickle"], device="cpu", allow_pickle=True)
    ids = torch.tensor([[1, 2, 3]])
    assert torch.equal(good(ids).logits, pickled(ids).logits)
    assert not good.training and good.dtype == torch.float32


def test_shard_index_entries(checkpoints, tmp_path):
    folder = tmp_path / "ck"
    shutil.copytree(checkpoints["good"], folder)
    (folder / "model.safetensors").rename(folder / "shard-1.safetensors")
    index = folder / "model.safetensors.index.json"
    for bad, fragment in (("/etc/passwd", "outside"), ("sub/../../x.safetensors", "outside"),
                          ("missing.safetensors", "missing"), ("", "not a file name")):
        index.write_text(json.dumps({"weight_map": {"lm_head.weight": bad}}))
        with pytest.raises((ValueError, FileNotFoundError), match=fragment):
            inspect_checkpoint(folder)
    index.write_text("{not json")
    with pytest.raises(ValueError, match="cannot read"):
        inspect_checkpoint(folder)
    index.write_text(json.dumps({"weight_map": {"lm_head.weight": "shard-1.safetensors"}}))
    assert inspect_checkpoint(folder)["model_type"] == "llama"


def test_tokenizer_with_custom_code_is_refused(checkpoints, tmp_path):
    folder = tmp_path / "tok"
    shutil.copytree(checkpoints["good"], folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="custom code"):
        load_tokenizer(folder)
    assert load_tokenizer(checkpoints["good"]).encode("w1 w2")


@pytest.mark.parametrize("device", ["foo", "meta", "cuda:99", "mps", 3])
def test_devices_outside_cpu_and_cuda_are_refused(device):
    if device == "cuda:99" and torch.cuda.is_available() and torch.cuda.device_count() > 99:
        pytest.skip("a machine with 100 GPUs")
    with pytest.raises((ValueError, TypeError), match="device"):
        resolve_device(device)
    with pytest.raises(ValueError, match="dtype"):
        resolve_dtype("int8", torch.device("cpu"))


# --- formats: GGUF files and hub ids in a (test-made) offline cache ---------------------------------------

def _no_load(monkeypatch):
    import transformers

    def never(*args, **kwargs):
        raise AssertionError("transformers was asked to load the weights")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", never)


@pytest.fixture
def gguf_files(tmp_path):
    pytest.importorskip("gguf", reason="GGUF files need the gguf package (pip install 'specdec[gguf]')")
    from gguf_helpers import write_tiny_gguf

    good = write_tiny_gguf(tmp_path / "tiny.gguf")
    data = good.read_bytes()
    (tmp_path / "truncated.gguf").write_bytes(data[: len(data) * 2 // 3])
    (tmp_path / "header-only.gguf").write_bytes(data[:200])
    (tmp_path / "junk.gguf").write_bytes(b"\x00" * 4096)
    write_tiny_gguf(tmp_path / "rwkv.gguf", architecture="rwkv6")
    write_tiny_gguf(tmp_path / "layers.gguf", block_count=3, tensor_layers=2)
    return tmp_path


@pytest.mark.parametrize("name, fragment", [
    ("truncated.gguf", "truncated"),
    ("header-only.gguf", "not a valid GGUF"),
    ("junk.gguf", "not a GGUF file"),
    ("rwkv.gguf", "architecture 'rwkv6'"),
    ("layers.gguf", "declares 3 layers"),
])
def test_bad_gguf_files_are_refused_naming_the_file(gguf_files, monkeypatch, name, fragment):
    _no_load(monkeypatch)
    with pytest.raises(ValueError, match=fragment) as info:
        load_model(gguf_files / name, what="target")
    message = str(info.value)
    assert message.startswith("target: ") and str(gguf_files / name) in message and "\n" not in message


def test_gguf_loads_with_its_tokenizer_and_in_a_folder(gguf_files):
    model = load_model(gguf_files / "tiny.gguf", device="cpu")
    same = load_model(gguf_files, device="cpu", model_kwargs={"gguf_file": "tiny.gguf"})
    eager = load_model(gguf_files / "tiny.gguf", device="cpu", model_kwargs={"attn_implementation": "eager"})
    assert eager.config._attn_implementation == "eager"  # options reach a GGUF load too
    ids = torch.tensor([[2, 3, 4, 5]])
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.num_hidden_layers == 2
    assert torch.equal(model(ids).logits, same(ids).logits)
    tokenizer = load_tokenizer(gguf_files / "tiny.gguf")
    assert tokenizer.encode("abc") == [2, 3, 4] and tokenizer.eos_token == "</s>"
    assert "m['role']" in tokenizer.chat_template
    with pytest.raises(ValueError, match="gguf_file"):  # a file, and a file name inside it
        load_model(gguf_files / "tiny.gguf", model_kwargs={"gguf_file": "tiny.gguf"})
    with pytest.raises(ValueError, match="inside the checkpoint folder"):
        load_model(gguf_files, model_kwargs={"gguf_file": "../tiny.gguf"})
    with pytest.raises(FileNotFoundError, match="not found"):
        load_model(gguf_files, model_kwargs={"gguf_file": "absent.gguf"})


def test_missing_gguf_package_is_one_line(gguf_files, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    with pytest.raises(ImportError, match=r"specdec\[gguf\]"):
        load_model(gguf_files / "tiny.gguf", what="target")


@pytest.fixture
def hub_cache(tmp_path, monkeypatch, checkpoints):
    from gguf_helpers import COMMIT, make_hub_cache

    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    make_hub_cache(cache, "org/tiny", checkpoints["good"])
    other = "fedcba9876543210fedcba9876543210fedcba98"
    make_hub_cache(cache, "org/tiny", checkpoints["good"], revision="v2", commit=other)
    make_hub_cache(cache, "org/empty", checkpoints["good"], skip=("model.safetensors",))
    make_hub_cache(cache, "org/evil", checkpoints["automap"])
    return {"cache": cache, "commit": COMMIT, "other": other}


def test_hub_id_loads_from_the_offline_cache(hub_cache, checkpoints):
    good = load_model(checkpoints["good"], device="cpu")
    ids = torch.tensor([[1, 2, 3]])
    for options in (None, {"revision": "v2"}, {"revision": hub_cache["commit"]}):
        model = load_model("org/tiny", device="cpu", model_kwargs=options)
        assert torch.equal(model(ids).logits, good(ids).logits)
    assert load_tokenizer("org/tiny").encode("w1 w2") == load_tokenizer(checkpoints["good"]).encode("w1 w2")
    # the cache can also be named per call
    assert load_model("org/tiny", device="cpu", model_kwargs={"cache_dir": str(hub_cache["cache"])}) is not None


@pytest.mark.parametrize("spec, options, error, fragment", [
    ("org/absent", None, FileNotFoundError, "not in the Hugging Face cache"),
    ("org/tiny", {"revision": "v9"}, FileNotFoundError, "no revision 'v9'"),
    ("org/tiny", {"revision": "a" * 40}, FileNotFoundError, "has no snapshot"),
    ("org/empty", None, FileNotFoundError, "has no weights"),
    ("org/evil", None, ValueError, "custom code"),
    ("../escape", None, FileNotFoundError, "not found"),
])
def test_bad_hub_entries_are_one_line(hub_cache, monkeypatch, spec, options, error, fragment):
    _no_load(monkeypatch)
    with pytest.raises(error, match=fragment) as info:
        load_model(spec, what="target", model_kwargs=options)
    message = str(info.value)
    assert message.startswith("target") and "\n" not in message
    if spec == "org/absent":
        assert str(hub_cache["cache"]) in message and "never downloads" in message
    if spec == "org/empty":
        assert hub_cache["commit"] in message  # the snapshot folder is named


# --- model options -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("options, fragment", [
    ({"trust_remote_code": True}, "trust_remote_code is refused"),
    ({"trust_remote_code": False}, "trust_remote_code is refused"),
    ({"local_files_only": False}, "local_files_only is refused"),
    ({"token": "hf_x"}, "token is refused"),
    ({"flash": 1}, "unknown model option 'flash'"),
    ({"attn_implementation": "magic"}, "attn_implementation must be"),
    ({"device_map": 3.5}, "device_map must be"),
    ({"device_map": {"model": "gpu7"}}, "not a device"),
    ({"torch_dtype": "int4"}, "torch_dtype must be"),
    ({"torch_dtype": "float32", "dtype": "bfloat16"}, "disagree"),
    ({"revision": "../../x"}, "revision must be"),
    ({"revision": "main"}, "applies to hub ids"),
    ({"subfolder": "/etc"}, "inside the checkpoint"),
    ({"quantization_config": {"bits": 4}}, "quant_method"),
    ({"low_cpu_mem_usage": "yes"}, "true or false"),
    ({"max_memory": {"0": "20GiB"}}, "needs a device_map"),
    ("revision=main", "must be a dict"),
])
def test_model_options_are_validated_before_loading(checkpoints, monkeypatch, options, fragment):
    _no_load(monkeypatch)
    with pytest.raises((ValueError, TypeError), match=fragment) as info:
        load_model(checkpoints["good"], model_kwargs=options)
    assert "\n" not in str(info.value)


def test_model_options_reach_from_pretrained(checkpoints, monkeypatch):
    import transformers

    seen = {}
    real = transformers.AutoModelForCausalLM.from_pretrained.__func__

    def spy(cls, *args, **kwargs):
        seen.update(kwargs)
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", classmethod(spy))
    model = load_model(checkpoints["good"], device="cpu", model_kwargs={
        "attn_implementation": "eager", "torch_dtype": "bfloat16", "low_cpu_mem_usage": True})
    assert seen["attn_implementation"] == "eager" and seen["low_cpu_mem_usage"] is True
    assert seen["trust_remote_code"] is False and seen["local_files_only"] is True and seen["use_safetensors"]
    assert model.dtype == torch.bfloat16 and model.config._attn_implementation == "eager"


def test_cli_model_option_values():
    from specdec.cli.common import MODEL_OPTION_KEYS as CLI_KEYS
    from specdec.loading.options import MODEL_OPTION_KEYS, parse_model_option

    assert tuple(CLI_KEYS) == tuple(MODEL_OPTION_KEYS)
    assert parse_model_option("revision=1234") == ("revision", "1234")
    assert parse_model_option("low-cpu-mem-usage=true") == ("low_cpu_mem_usage", True)
    assert parse_model_option("device_map=0") == ("device_map", "0")
    assert parse_model_option('quantization_config={"quant_method": "x"}') == ("quantization_config",
                                                                              {"quant_method": "x"})
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_model_option("revision")


# --- the config against the weights --------------------------------------------------------------------------

def _with_config(src, dst, **changes):
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config.update(changes)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def test_config_declaring_layers_the_weights_lack_is_refused(checkpoints, tmp_path, monkeypatch):
    more = _with_config(checkpoints["good"], tmp_path / "more", num_hidden_layers=3)
    fewer = _with_config(checkpoints["good"], tmp_path / "fewer", num_hidden_layers=1)
    huge = _with_config(checkpoints["good"], tmp_path / "huge", num_hidden_layers=1_000_000)
    wide = _with_config(checkpoints["good"], tmp_path / "wide", hidden_size=10**9)
    with pytest.raises(ValueError, match=r"declares 3 layers .*\(layer 2 missing"):
        load_model(more)
    with pytest.raises(ValueError, match="unexpected tensors of layers 1..1"):
        load_model(fewer)
    with pytest.raises(ValueError, match="num_hidden_layers 1000000, more than specdec accepts"):
        load_model(huge)  # refused from config.json alone: nothing allocated, no hang
    with pytest.raises(ValueError, match="hidden_size 1000000000"):
        load_model(wide)
    model = load_model(more, device="cpu", allow_weight_mismatch=True)  # opted in: transformers' random layer 2
    assert model.config.num_hidden_layers == 3


def test_missing_and_unexpected_tensors_are_named(checkpoints, tmp_path):
    from safetensors.torch import load_file, save_file

    tensors = load_file(checkpoints["good"] / "model.safetensors")
    lacking = tmp_path / "lacking"
    shutil.copytree(checkpoints["good"], lacking)
    save_file({k: v for k, v in tensors.items() if k != "model.norm.weight"}, lacking / "model.safetensors",
              metadata={"format": "pt"})
    extra = tmp_path / "extra"
    shutil.copytree(checkpoints["good"], extra)
    save_file({**tensors, "model.spare.weight": torch.zeros(3)}, extra / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="lacks weights .*model.norm.weight") as info:
        load_model(lacking, what="target")
    assert str(lacking) in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ValueError, match="does not use: model.spare.weight"):
        load_model(extra, what="target")
    assert load_model(extra, device="cpu", allow_weight_mismatch=True) is not None


def test_a_folder_of_gguf_files_says_how_to_pick_one(gguf_files):
    with pytest.raises(FileNotFoundError, match="gguf_file=NAME") as info:
        load_model(gguf_files, what="target")
    assert "header-only.gguf" in str(info.value) and "3 more" in str(info.value)


@pytest.mark.parametrize("argv, fragment", [
    (["train", "distill", "--target", "/nonexistent/t", "--draft", "{good}", "--data", "{good}", "--out", "{out}"],
     "--target not found"),
    (["train", "distill", "--target", "{good}", "--draft", "{good}", "--data", "{good}", "--out", "{out}",
      "--draft-model-option", "trust_remote_code=true"], "--draft-model-option: model option trust_remote_code"),
    (["train", "head", "--target", "{good}", "--data", "{good}", "--out", "{out}", "--model-option", "x=1"],
     "--model-option: unknown model option 'x'"),
    (["beam", "--target", "{good}", "--prompt", "w1", "--model-option", "revision=v1"], "applies to hub ids"),
    (["analyze", "--target", "{good}", "--draft", "{good}", "--prompts", "{good}/config.json",
      "--model-option", "device_map=gpu9"], "--model-option: model option device_map must be"),
])
def test_every_checkpoint_command_validates_model_options(capsys, checkpoints, tmp_path, argv, fragment):
    from specdec.cli import main

    argv = [a.format(good=checkpoints["good"], out=tmp_path / "out") for a in argv]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, err


def test_gguf_header_reader_agrees_with_gguf_and_is_bounded(gguf_files, tmp_path, monkeypatch):
    import struct

    from gguf import GGUFReader

    from specdec.loading.gguf import read_gguf_header

    ours, ref = read_gguf_header(gguf_files / "tiny.gguf"), GGUFReader(str(gguf_files / "tiny.gguf"))
    assert ours.data_start == ref.data_offset
    expected = [(t.name, int(t.n_elements), int(t.data_offset) - ref.data_offset) for t in ref.tensors]
    assert [(name, elements, offset) for name, elements, _, offset in ours.tensors] == expected
    assert ours.metadata["general.architecture"] == "llama" and ours.metadata["llama.block_count"] == 2
    # counts no real file has are refused before anything is read or allocated for them
    huge = tmp_path / "huge.gguf"
    huge.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1 << 40, 1) + b"\0" * 64)
    _no_load(monkeypatch)
    with pytest.raises(ValueError, match="not a real file"):
        load_model(huge, what="target")
