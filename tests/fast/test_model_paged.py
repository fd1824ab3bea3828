"""FastLlama over a paged KV cache (`fast.cache.PagedKVCache`: rows over a block pool through a block table, the
blocks of a row scattered in the pool) computes the static cache's logits bit for bit, fp32 on CPU: a ragged
prefill, a step, a rollback (a length move) and a rewrite; sliding windows and soft-caps (Gemma 2), token trees,
the batch-invariant kernels; and transformers' logits."""

import pytest
import torch

from helpers import RAGGED_PROMPTS, right_padded
from specdec.fast import FastLlama
from specdec.fast.cache import PagedKVCache, TreeNodes

transformers = pytest.importorskip("transformers")
T = transformers
COMMON = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)
WINDOWED = {  # (a window of 6: far shorter than the texts)
    "gemma2": lambda: T.Gemma2ForCausalLM(T.Gemma2Config(**COMMON, head_dim=16, query_pre_attn_scalar=12,
                                                         sliding_window=6, attn_logit_softcapping=4.0)),
    "qwen2-window": lambda: T.Qwen2ForCausalLM(T.Qwen2Config(**COMMON, use_sliding_window=True, sliding_window=6,
                                                             max_window_layers=1)),
}
PARENTS = [-1, 0, 0, 1, 1, 2, 2, 3, 4, 5, 6]  # a [2, 2, 1] tree, breadth first



def _make(name):
    torch.manual_seed(0)
    model = WINDOWED[name]()
    with torch.no_grad():  # (random norms and weights: transformers initializes norms to exact 0/1)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def tree_nodes() -> TreeNodes:
    depths, bits = [], []
    for i, parent in enumerate(PARENTS):
        depths.append(0 if parent < 0 else depths[parent] + 1)
        bits.append((1 << i) | (bits[parent] if parent >= 0 else 0))
    return TreeNodes(0, torch.tensor(depths), torch.tensor(bits))


BLOCK = 16
SLOTS = 47  # the static cache: round_up(47 + 1, 16) = 48 positions = 3 blocks of 16


def paged_cache(model: FastLlama, batch: int, blocks_per_row: int, seed: int = 0, block_size: int = BLOCK):
    """A pool with every row's blocks drawn at random (block 0 left as the null block)."""
    s = model.shape
    total = batch * blocks_per_row + 3
    order = torch.randperm(total - 1, generator=torch.Generator().manual_seed(seed))[: batch * blocks_per_row] + 1
    table = order.view(batch, blocks_per_row).to(torch.int32)

    def pool():
        return torch.zeros(total, block_size, s.n_kv_heads, s.head_dim, dtype=model.dtype)

    return PagedKVCache([pool() for _ in range(s.n_layers)], [pool() for _ in range(s.n_layers)],
                        torch.zeros(batch, dtype=torch.long), table)


def run(fast, cache, prompts, more):
    tokens, valid = right_padded(prompts)
    prefill = fast(tokens, cache, valid)
    step = fast(more, cache)
    cache.lengths.sub_(3)  # reject three of the four
    rewrite = fast(more[:, 1:3].flip(1), cache)
    return prefill, step, rewrite, cache.lengths.clone()


@pytest.mark.parametrize("name", ["llama", "gemma2", "qwen2-window"])
def test_paged_logits_are_the_static_caches_bits(name, make_llama):
    hf = make_llama(3, layers=2) if name == "llama" else _make(name)
    fast = FastLlama.from_hf(hf, kernels="reference")
    prompts = RAGGED_PROMPTS + [list(range(3, 25))]
    more = torch.randint(3, 64, (len(prompts), 4), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        static = run(fast, fast.new_cache(len(prompts), SLOTS), prompts, more)
        paged = run(fast, paged_cache(fast, len(prompts), 3), prompts, more)
        for a, b in zip(static, paged):
            assert torch.equal(a, b)
        for b, p in enumerate(prompts):  # and transformers' own
            ref = hf(torch.tensor([p + more[b].tolist()])).logits[0]
            torch.testing.assert_close(paged[1][b], ref[len(p):], atol=1e-4, rtol=0)


def test_a_wrong_table_changes_the_logits(make_llama):
    """Negative control: the same pool read through another row's blocks is not the static cache's text."""
    fast = FastLlama.from_hf(make_llama(3, layers=2), kernels="reference")
    prompts = RAGGED_PROMPTS[:3]
    more = torch.randint(3, 64, (3, 4), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        tokens, valid = right_padded(prompts)
        static, paged = fast.new_cache(3, SLOTS), paged_cache(fast, 3, 3)
        fast(tokens, static, valid), fast(tokens, paged, valid)
        paged.block_table.copy_(paged.block_table.roll(1, 0))  # rows read each other's blocks
        assert not torch.equal(fast(more, static), fast(more, paged))


def test_tree_pass_and_bitwise_read_through_the_table(make_llama):
    hf = make_llama(3, layers=2)
    fast = FastLlama.from_hf(hf, kernels="reference")
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 3], [3, 4, 5]]
    nodes = torch.randint(0, 64, (3, len(PARENTS)), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        outs = []
        for cache in (fast.new_cache(3, SLOTS), paged_cache(fast, 3, 3, seed=2)):
            tokens, valid = right_padded([p[:-1] for p in prompts])
            fast(tokens, cache, valid)
            outs.append(fast(nodes, cache, tree=tree_nodes()))
        assert torch.equal(outs[0], outs[1])
        fast.bitwise = True
        more = torch.randint(3, 64, (3, 4), generator=torch.Generator().manual_seed(0))
        static = run(fast, fast.new_cache(3, SLOTS), prompts, more)
        paged = run(fast, paged_cache(fast, 3, 3, seed=3), prompts, more)
        for a, b in zip(static, paged):
            assert torch.equal(a, b)


def test_the_fused_layer_writes_and_reads_through_the_table(make_llama):
    """The fused layer (Triton's interpreter on CPU) over a paged cache: RoPE + the K/V write land at each row's
    flat pool entries (the pool seen with batch stride 0) and the attention reads through the table — the static
    cache's logits through the same kernels; a wrong table (rows swapped) changes them (negative control)."""
    pytest.importorskip("triton")
    fast = FastLlama.from_hf(make_llama(3, layers=2), kernels="triton")
    prompts = RAGGED_PROMPTS[:3]
    more = torch.randint(3, 64, (3, 4), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        static = run(fast, fast.new_cache(3, SLOTS), prompts, more)
        paged_cache_ = paged_cache(fast, 3, 3, seed=4)
        paged = run(fast, paged_cache_, prompts, more)
        for a, b in zip(static, paged):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
        again = fast.new_cache(3, SLOTS)
        run(fast, again, prompts, more)
        torch.testing.assert_close(fast(more, paged_cache_), fast(more, again), atol=1e-5, rtol=0)
        paged_cache_.block_table.copy_(paged_cache_.block_table.roll(1, 0))  # rows read each other's blocks
        assert not torch.allclose(fast(more, paged_cache_), fast(more, again), atol=1e-3)
