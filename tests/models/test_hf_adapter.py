"""The HF causal adapter: per-row rollback keeps the cache exactly equivalent to a fresh run."""

import torch

from specdec.models.hf import HFCausalLM


def fresh_last_logits(model, rows):
    return torch.stack([model(torch.tensor([r])).logits[0, -1] for r in rows])


@torch.no_grad()
def test_crop_per_row_then_continue_matches_fresh_run(llama):
    lm = HFCausalLM(llama)
    prompts = [[5, 6, 7, 8], [9], [10, 11]]
    ctx = lm.begin(prompts, 16)
    lm.forward(torch.tensor([[8, 20, 21, 22], [9, 30, 31, 32], [11, 40, 41, 42]]))
    lm.crop(torch.tensor([5, 2, 3]))  # keep 1, 1 and 1 of the new drafts... per row
    assert lm.lengths.tolist() == [5, 2, 3]
    logits = lm.forward(torch.tensor([[23], [33], [43]]))[:, -1]
    expected = fresh_last_logits(llama, [[5, 6, 7, 8, 20, 23], [9, 30, 33], [10, 11, 40, 43]])
    assert torch.allclose(logits, expected, atol=1e-5)
    assert ctx.lengths.tolist() == [4, 1, 2]


@torch.no_grad()
def test_compact_and_select_rows_preserve_the_text(llama):
    lm = HFCausalLM(llama)
    lm.begin([[5, 6, 7, 8], [9], [10, 11]], 16)
    lm.forward(torch.tensor([[8, 20, 21], [9, 30, 31], [11, 40, 41]]))
    lm.crop(torch.tensor([4, 3, 2]))
    lm.compact()
    assert lm.num_slots == 4
    lm.select_rows(torch.tensor([0, 1]))
    logits = lm.forward(torch.tensor([[22], [32]]))[:, -1]
    expected = fresh_last_logits(llama, [[5, 6, 7, 8, 22], [9, 30, 31, 32]])
    assert torch.allclose(logits, expected, atol=1e-5)


def test_crop_cannot_grow(llama):
    lm = HFCausalLM(llama)
    lm.begin([[5, 6, 7]], 4)
    try:
        lm.crop(10)
    except ValueError as err:
        assert "shorten" in str(err)
    else:
        raise AssertionError("crop to a longer length must fail")


def test_automatic_compaction_keeps_greedy_output(llama, llama_draft, monkeypatch):
    import specdec
    from specdec.models import hf

    prompts = [[5, 6, 7], [9], [10, 11, 12, 13, 14]]
    # (the eager loop's adapter: engine="hf")
    expected = specdec.generate(llama, prompts, drafter=llama_draft, temperature=0, max_new_tokens=40, eos_token_id=[],
                                engine="hf")
    calls = []
    original_init, original_compact = hf.HFCausalLM.__init__, hf.HFCausalLM.compact

    def init(self, model):
        original_init(self, model)
        self.compact_after_holes = 2  # compact almost every step

    def compact(self):
        calls.append(self.num_slots)
        original_compact(self)

    monkeypatch.setattr(hf.HFCausalLM, "__init__", init)
    monkeypatch.setattr(hf.HFCausalLM, "compact", compact)
    got = specdec.generate(llama, prompts, drafter=llama_draft, temperature=0, max_new_tokens=40, eos_token_id=[],
                           engine="hf")
    assert calls, "compaction never ran"
    assert got.sequences == expected.sequences
