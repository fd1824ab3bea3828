"""One forward over a ragged batch (`fast.ragged.forward_ragged`: prefill chunks and decode / verify rows of different
lengths over the paged pool) computes what each row computes alone through `FastLlama.forward` on a static cache,
fp32 on CPU: bit for bit under the batch-invariant kernels (`bitwise`: the same GEMM and attention bits whatever the
row count, span and batch), to 1e-5 on the default reference path (there the CPU GEMMs choose their blocking by row
count, `kernels.cpu_linear`, and SDPA by shape, so N flat tokens and a row's k tokens round differently); K/V in the
pool equal; greedy continuation after a chunked ragged prefill equals a whole prefill's; windows and soft-caps
(Gemma 2/3, Qwen2), learned positions (GPT-2), parallel residuals (GPT-NeoX); a row's result does not depend on the
other rows; negative controls: a wrong block table entry and a causal mask one position off."""

import dataclasses

import pytest
import torch

from specdec.fast import FastLlama
from specdec.fast.cache import PagedKVCache
from specdec.fast.ragged import RaggedBatch, RaggedRow, covers, forward_ragged

transformers = pytest.importorskip("transformers")
T = transformers
COMMON = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)
FAMILIES = {  # (windows of 6: far shorter than the texts)
    "gemma2": lambda: T.Gemma2ForCausalLM(T.Gemma2Config(**COMMON, head_dim=16, query_pre_attn_scalar=12,
                                                         sliding_window=6, attn_logit_softcapping=4.0,
                                                         final_logit_softcapping=6.0)),
    "qwen2-window": lambda: T.Qwen2ForCausalLM(T.Qwen2Config(**COMMON, use_sliding_window=True, sliding_window=6,
                                                             max_window_layers=1)),
    "gemma3": lambda: T.Gemma3ForCausalLM(T.Gemma3TextConfig(
        **COMMON, head_dim=16, query_pre_attn_scalar=20, sliding_window=6,
        layer_types=["sliding_attention", "full_attention"])),
    "gpt-neox": lambda: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(**COMMON, rotary_pct=0.5)),
    "gpt2": lambda: T.GPT2LMHeadModel(T.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=96)),
}
BLOCK = 4
TEXT = torch.randint(3, 64, (8, 48), generator=torch.Generator().manual_seed(7)).tolist()
# (name, text, start, new tokens, scored): first, middle and last prefill chunks; verify rows of γ = 3, 0, 1, 5
MIX = [("first", 0, 0, 12, 0), ("middle", 1, 8, 12, 0), ("last", 2, 16, 7, 1), ("verify3", 3, 20, 4, 4),
       ("decode", 4, 5, 1, 1), ("verify1", 5, 30, 2, 2), ("verify5", 6, 9, 6, 6), ("whole", 7, 0, 23, 1)]


def family(name, make_llama):
    if name == "llama":
        return FastLlama.from_hf(make_llama(3, layers=2), kernels="reference")
    torch.manual_seed(0)
    hf = FAMILIES[name]()
    with torch.no_grad():  # (random norms: transformers initializes them to exact 0/1)
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return FastLlama.from_hf(hf.eval(), kernels="reference")


class Pool:
    """A block pool with each row's blocks drawn at random (block 0 the null block, never handed out)."""

    def __init__(self, fast, num_blocks=120, seed=0):
        s = fast.shape
        size, like = (num_blocks, BLOCK, s.n_kv_heads, s.head_dim), dict(device=fast.device, dtype=fast.dtype)
        make = lambda: [torch.zeros(size, **like) for _ in range(s.n_layers)]  # noqa: E731
        self.cache = PagedKVCache(make(), make(), torch.zeros(1, dtype=torch.long), torch.zeros(1, 1, dtype=torch.int32))
        self.free = (torch.randperm(num_blocks - 1, generator=torch.Generator().manual_seed(seed)) + 1).tolist()
        self.blocks = {}

    def table(self, name, end):
        have = self.blocks.setdefault(name, [])
        while len(have) * BLOCK < end:
            have.append(self.free.pop())
        return have


def ragged(fast, pool, rows, kernels=None):
    """rows: (name, text, start, new, scored) → {name: logits}; histories [0, start) fed by an earlier ragged pass."""
    history = [RaggedRow(TEXT[t][:s], 0, pool.table(n, s + k), 0) for n, t, s, k, _ in rows if s]
    if history:
        forward_ragged(fast, RaggedBatch.from_rows(history, block_size=BLOCK, device=fast.device), pool.cache,
                       kernels=kernels)
    batch = RaggedBatch.from_rows([RaggedRow(TEXT[t][s : s + k], s, pool.table(n, s + k), m)
                                   for n, t, s, k, m in rows], block_size=BLOCK, device=fast.device)
    logits = forward_ragged(fast, batch, pool.cache, kernels=kernels)
    return {row[0]: batch.row_logits(logits, b) for b, row in enumerate(rows)}


def alone(fast, text, start, new, scored):
    """The row through today's forward on a static cache: its history, then its new tokens."""
    cache = fast.new_cache(1, 63)
    if start:
        fast(torch.tensor([TEXT[text][:start]]), cache)
    out = fast(torch.tensor([TEXT[text][start : start + new]]), cache)[0]
    return out[out.shape[0] - scored :], cache


def pool_kv(pool, name, end, layer):
    """A row's keys `[H_kv, end, D]` read back from the pool through its blocks."""
    return pool.cache.keys[layer][torch.tensor(pool.blocks[name])].flatten(0, 1)[:end].transpose(0, 1)


@pytest.mark.parametrize("name", ["llama", "gemma2", "qwen2-window", "gemma3", "gpt-neox", "gpt2"])
def test_a_mixed_batch_equals_each_row_alone(name, make_llama):
    fast = family(name, make_llama)
    bitwise = name == "llama"
    fast.bitwise = bitwise
    with torch.inference_mode():
        pool = Pool(fast)
        got = ragged(fast, pool, MIX)
        for n, t, s, k, m in MIX:
            want, cache = alone(fast, t, s, k, m)
            assert got[n].shape == (m, 64)
            for layer in range(fast.shape.n_layers):  # K/V in the pool: the static cache's
                kv = pool_kv(pool, n, s + k, layer)
                if bitwise:
                    assert torch.equal(kv, cache.keys[layer][0, :, : s + k])
                else:
                    torch.testing.assert_close(kv, cache.keys[layer][0, :, : s + k], atol=1e-5, rtol=0)
            if bitwise:
                assert torch.equal(got[n], want), n
            else:
                torch.testing.assert_close(got[n], want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["llama", "gemma2"])
def test_a_row_does_not_depend_on_the_others(name, make_llama):
    """The same rows alone, in other mixes, in another order, over other blocks: the same bits (bitwise) / 1e-5."""
    fast = family(name, make_llama)
    fast.bitwise = name == "llama"
    check = torch.equal if fast.bitwise else (lambda a, b: torch.allclose(a, b, atol=1e-5, rtol=0))
    with torch.inference_mode():
        base = ragged(fast, Pool(fast, seed=1), MIX)
        mixes = [MIX[::-1], MIX[3:5], MIX[1:2] + MIX[6:], [MIX[3]], [MIX[2]]]
        for seed, mix in enumerate(mixes, start=2):
            other = ragged(fast, Pool(fast, seed=seed), mix)
            for n in other:
                assert check(other[n], base[n]), (n, seed)


@pytest.mark.parametrize("bitwise", [False, True])
def test_chunked_ragged_prefill_then_greedy_equals_a_whole_prefill(bitwise, make_llama):
    """Three prompts prefilled in chunks of different sizes over ragged passes shared with each other (the chunks
    of one row land in different passes), then greedy decoding one ragged row each: the tokens of a whole
    prefill and greedy forwards on a static cache, and the same final logits (the same bits under bitwise)."""
    fast = family("llama", make_llama)
    fast.bitwise = bitwise
    prompts = [TEXT[0][:29], TEXT[1][:11], TEXT[2][:20]]
    chunks = [7, 4, 20]
    with torch.inference_mode():
        pool, done, outs, last = Pool(fast, seed=5), [0, 0, 0], [[], [], []], {}
        while min(d - len(p) for d, p in zip(done, prompts)) < 0:
            rows, names = [], []
            for b, p in enumerate(prompts):
                if done[b] < len(p):
                    end = min(done[b] + chunks[b], len(p))
                    rows.append(RaggedRow(p[done[b] : end], done[b], pool.table(b, end + 8), int(end == len(p))))
                    names.append((b, end))
            batch = RaggedBatch.from_rows(rows, block_size=BLOCK)
            logits = forward_ragged(fast, batch, pool.cache)
            for r, (b, end) in enumerate(names):
                if end == len(prompts[b]):
                    last[b] = batch.row_logits(logits, r)[0]
                done[b] = end
        tokens = [int(last[b].argmax()) for b in range(3)]
        for b in range(3):
            outs[b].append(tokens[b])
        for _ in range(6):
            rows = [RaggedRow([outs[b][-1]], len(prompts[b]) + len(outs[b]) - 1, pool.table(b, 0), 1)
                    for b in range(3)]
            logits = forward_ragged(fast, RaggedBatch.from_rows(rows, block_size=BLOCK), pool.cache)
            for b in range(3):
                outs[b].append(int(logits[b].argmax()))
        for b, p in enumerate(prompts):
            cache = fast.new_cache(1, 63)
            whole = fast(torch.tensor([p]), cache)[0, -1]
            torch.testing.assert_close(last[b], whole, atol=0 if bitwise else 1e-5, rtol=0)
            want = [int(whole.argmax())]
            for _ in range(6):
                want.append(int(fast(torch.tensor([[want[-1]]]), cache)[0, -1].argmax()))
            assert outs[b] == want


def test_the_pool_is_the_paged_caches_layout(make_llama):
    """K/V a ragged pass wrote are read by today's `FastLlama.forward` over a `PagedKVCache` of the same blocks: a
    step after a ragged prefill is the static cache's step (bits under bitwise)."""
    fast = family("llama", make_llama)
    fast.bitwise = True
    prompts, more = [TEXT[0][:13], TEXT[1][:6]], torch.tensor([TEXT[2][:3], TEXT[3][:3]])
    with torch.inference_mode():
        pool = Pool(fast, seed=4)
        rows = [RaggedRow(p, 0, pool.table(b, 20), 0) for b, p in enumerate(prompts)]
        forward_ragged(fast, RaggedBatch.from_rows(rows, block_size=BLOCK), pool.cache)
        table = torch.tensor([pool.blocks[0], pool.blocks[1]], dtype=torch.int32)
        paged = PagedKVCache(pool.cache.keys, pool.cache.values, torch.tensor([13, 6]), table)
        static = fast.new_cache(2, 19)
        fast(torch.tensor([prompts[0], prompts[1] + [0] * 7]), static,
             torch.tensor([[True] * 13, [True] * 6 + [False] * 7]))
        assert torch.equal(fast(more, paged), fast(more, static))


def test_one_batch_drives_the_target_and_a_drafter(make_llama):
    """One `RaggedBatch` (one set of block tables) over two models, each its own pool of the same blocks (the
    target's and a cached drafter's, as `engine.kv_pool` lays them out): each model's rows equal their rows alone."""
    target, draft = family("llama", make_llama), FastLlama.from_hf(make_llama(5, layers=1), kernels="reference")
    rows = [r for r in MIX if r[0] in ("middle", "verify3", "decode")]
    with torch.inference_mode():
        pool = Pool(target, seed=6)
        got = ragged(target, pool, rows)
        draft_pool = Pool(draft)
        draft_pool.blocks = pool.blocks  # (the same blocks: every row's table is already long enough)
        mine = ragged(draft, draft_pool, rows)
        for n, t, s, k, m in rows:
            torch.testing.assert_close(got[n], alone(target, t, s, k, m)[0], atol=1e-5, rtol=0)
            torch.testing.assert_close(mine[n], alone(draft, t, s, k, m)[0], atol=1e-5, rtol=0)


def test_triton_kernel_in_the_pass(make_llama):
    """The pass with the Triton varlen kernel (Triton's interpreter on CPU) equals each row alone: windows and a
    softcap (Gemma 2)."""
    pytest.importorskip("triton")
    fast = family("gemma2", make_llama)
    with torch.inference_mode():
        got = ragged(fast, Pool(fast), MIX[:6], kernels="triton")
        for n, t, s, k, m in MIX[:6]:
            torch.testing.assert_close(got[n], alone(fast, t, s, k, m)[0], atol=1e-5, rtol=0)


def test_feature_hidden_states(make_llama):
    """return_hidden gives the final-normed states (or the `feature_layers` inputs) of the scored positions."""
    fast = family("llama", make_llama)
    rows = [RaggedRow(TEXT[0][:9], 0, [1, 2, 3], 3), RaggedRow(TEXT[1][:5], 0, [4, 5], 1)]
    with torch.inference_mode():
        for layers in (None, (0, 1)):
            fast.feature_layers = layers
            pool = Pool(fast)
            logits, hidden = forward_ragged(fast, RaggedBatch.from_rows(rows, block_size=BLOCK), pool.cache,
                                            return_hidden=True)
            ref = [fast(torch.tensor([r.tokens]), fast.new_cache(1, 15), return_hidden=True) for r in rows]
            want = torch.cat([ref[0][1][0, -3:], ref[1][1][0, -1:]])
            assert hidden.shape == want.shape == (4, 32 * (1 if layers is None else 2))
            torch.testing.assert_close(hidden, want, atol=1e-5, rtol=0)
        fast.feature_layers = None


def test_negative_controls_a_wrong_block_and_an_off_by_one_mask(make_llama):
    """The pass read through a wrong block table entry, or with each query seeing one slot further (the next
    token's), is not each row alone: the comparisons above can fail."""
    fast = family("llama", make_llama)
    fast.bitwise = True
    rows = [r for r in MIX if r[0] in ("middle", "verify3", "verify5")]
    with torch.inference_mode():
        pool = Pool(fast, seed=3)
        ragged(fast, pool, rows)  # the histories and the blocks
        want = {n: alone(fast, t, s, k, m)[0] for n, t, s, k, m in rows}
        specs = [RaggedRow(TEXT[t][s : s + k], s, pool.blocks[n], m) for n, t, s, k, m in rows]
        good = RaggedBatch.from_rows(specs, block_size=BLOCK)
        assert torch.equal(good.row_logits(forward_ragged(fast, good, pool.cache), 1), want["verify3"])
        wrong = [dataclasses.replace(specs[1], blocks=[pool.blocks["verify5"][0]] + pool.blocks["verify3"][1:])]
        bad = RaggedBatch.from_rows(wrong, block_size=BLOCK)  # (its first block: another row's)
        assert not torch.allclose(forward_ragged(fast, bad, pool.cache), want["verify3"], atol=1e-3)
        shifted = dataclasses.replace(good.layout, positions=good.positions + 1, _memo={})
        off = dataclasses.replace(good, layout=shifted)
        assert not torch.allclose(off.row_logits(forward_ragged(fast, off, pool.cache), 1), want["verify3"],
                                  atol=1e-3)


def test_the_pass_covers_subclasses_that_keep_the_eager_layers(make_llama):
    """A subclass overriding only the GEMM helpers (a tensor-parallel shard: `distributed.ShardedFastLlama`, run
    on 2 gloo ranks by tests/distributed/test_tensor_parallel_paged.py) runs the pass; one with layers of its own
    (EAGLE's) is refused by name."""
    from specdec.distributed.sharded import ShardedFastLlama
    from specdec.fast.eagle import EagleLayer

    fast = family("llama", make_llama)
    assert covers(fast) and ShardedFastLlama._eager_layers is FastLlama._eager_layers
    own = type("OwnLayers", (FastLlama,), {"_eager_layers": lambda self, *a, **k: None})
    mine = own(fast.shape)
    assert not covers(mine) and EagleLayer._eager_layers is not FastLlama._eager_layers
    batch = RaggedBatch.from_rows([RaggedRow([5, 6], 0, [3], 1)], block_size=BLOCK)
    with pytest.raises(TypeError, match="got OwnLayers"):
        forward_ragged(mine, batch, Pool(fast).cache)


def test_the_pass_names_bad_arguments(make_llama):
    fast = family("llama", make_llama)
    pool = Pool(fast)
    batch = RaggedBatch.from_rows([RaggedRow([5, 6], 0, [3], 1)], block_size=BLOCK)
    with pytest.raises(TypeError, match="model must be a FastLlama"):
        forward_ragged(torch.nn.Linear(2, 2), batch, pool.cache)
    with pytest.raises(ValueError, match="past the vocabulary"):
        forward_ragged(fast, RaggedBatch.from_rows([RaggedRow([64], 0, [3], 1)], block_size=BLOCK), pool.cache)
    with pytest.raises(ValueError, match="block_size"):
        forward_ragged(fast, RaggedBatch.from_rows([RaggedRow([5], 0, [3], 1)], block_size=8), pool.cache)
    with pytest.raises(ValueError, match="the pool has 120 blocks"):
        forward_ragged(fast, RaggedBatch.from_rows([RaggedRow([5], 0, [130], 1)], block_size=BLOCK), pool.cache)
    with pytest.raises(ValueError, match="cache must hold"):
        forward_ragged(fast, batch, object())


def test_the_batch_names_bad_arguments():
    row = RaggedRow([5, 6, 7], 2, [3, 4], 1)
    with pytest.raises(ValueError, match="rows must be"):
        RaggedBatch.from_rows([], block_size=4)
    with pytest.raises(ValueError, match=r"rows\[0\].tokens is empty"):
        RaggedBatch.from_rows([dataclasses.replace(row, tokens=[])], block_size=4)
    with pytest.raises(ValueError, match=r"rows\[1\].num_logits"):
        RaggedBatch.from_rows([row, dataclasses.replace(row, num_logits=4, blocks=[5, 6])], block_size=4)
    with pytest.raises(ValueError, match=r"rows\[0\].blocks: 1 blocks"):
        RaggedBatch.from_rows([dataclasses.replace(row, blocks=[3])], block_size=4)
    with pytest.raises(ValueError, match="null block"):
        RaggedBatch.from_rows([dataclasses.replace(row, blocks=[3, 0, 5])], block_size=2)
    with pytest.raises(ValueError, match="same pool entry"):
        RaggedBatch.from_rows([row, row], block_size=4)
    with pytest.raises(ValueError, match=r"rows\[0\].start must be >= 0"):
        RaggedBatch.from_rows([dataclasses.replace(row, start=-1)], block_size=4)
    with pytest.raises(TypeError, match=r"rows\[1\].tokens must hold ints, got 6.5"):
        RaggedBatch.from_rows([row, RaggedRow([5, 6.5], 0, [9], 0)], block_size=4)
    with pytest.raises(TypeError, match=r"rows\[1\].blocks must hold ints, got '9'"):
        RaggedBatch.from_rows([row, RaggedRow([5], 0, ["9"], 0)], block_size=4)
    with pytest.raises(ValueError, match=r"rows\[1\].tokens holds a negative id"):
        RaggedBatch.from_rows([row, RaggedRow([5, -1], 0, [9], 0)], block_size=4)
    with pytest.raises(ValueError, match="table_width"):
        RaggedBatch.from_rows([row], block_size=4, table_width=1)
    batch = RaggedBatch.from_rows([row, RaggedRow([9], 0, [7], 0)], block_size=4, table_width=3)
    assert batch.counts == (3, 1) and batch.query_start.tolist() == [0, 3, 4]
    assert batch.positions.tolist() == [2, 3, 4, 0] and batch.logits_index.tolist() == [2]
    assert batch.slot_mapping.tolist() == [14, 15, 16, 28] and batch.block_table.tolist() == [[3, 4, 0], [7, 0, 0]]
