"""Shared fixtures: tiny random transformers models built from configs (no downloads)."""

from __future__ import annotations

import os

import pytest
import torch

from helpers import RAGGED_PROMPTS, save_tiny_pair  # noqa: F401  (RAGGED_PROMPTS: some tests import it from conftest)
from interpreter_dot import fixed_order_dot  # noqa: F401  (a fixture: Triton's interpreter without the host's BLAS)

transformers = pytest.importorskip("transformers")

# Without a GPU, Triton kernels run in Triton's interpreter (on CPU tensors): set before anything imports triton.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

VOCAB = 64

# Tiny models run fastest on one thread, and CI machines have two cores.
torch.set_num_threads(1)


def _llama(seed: int, layers: int = 2, hidden: int = 32, vocab: int = VOCAB, **kw):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, **kw,
    )
    return transformers.LlamaForCausalLM(cfg).eval()


def _gpt2(seed: int, layers: int = 2, vocab: int = VOCAB, n_positions: int = 128):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(vocab_size=vocab, n_embd=32, n_layer=layers, n_head=4, n_positions=n_positions)
    return transformers.GPT2LMHeadModel(cfg).eval()


def _qwen2(seed: int, layers: int = 2, vocab: int = VOCAB):
    torch.manual_seed(seed)
    cfg = transformers.Qwen2Config(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, use_sliding_window=False,
    )
    return transformers.Qwen2ForCausalLM(cfg).eval()


@pytest.fixture(scope="session")
def llama():
    return _llama(0)


@pytest.fixture(scope="session")
def llama_draft():
    return _llama(1, layers=1, hidden=32)


@pytest.fixture(scope="session")
def gpt2():
    return _gpt2(0)


@pytest.fixture(scope="session")
def gpt2_draft():
    return _gpt2(1, layers=1)


def _opt(seed: int, layers: int = 2, vocab: int = VOCAB):
    """A family the fast engine does not cover (its transformers loop is the only runner)."""
    torch.manual_seed(seed)
    cfg = transformers.OPTConfig(vocab_size=vocab, hidden_size=32, ffn_dim=64, num_hidden_layers=layers,
                                 num_attention_heads=4, max_position_embeddings=128, word_embed_proj_dim=32,
                                 pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return transformers.OPTForCausalLM(cfg).eval()


@pytest.fixture(scope="session")
def opt():
    return _opt(0)


@pytest.fixture(scope="session")
def qwen2():
    return _qwen2(0)


@pytest.fixture(scope="session")
def make_llama():
    return _llama


@pytest.fixture(scope="session")
def make_gpt2():
    return _gpt2



@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A folder with a tiny random target and drafter checkpoint (`target/`, `draft/`), one per test module."""
    return save_tiny_pair(tmp_path_factory.mktemp("ckpt"))
