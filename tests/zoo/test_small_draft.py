"""The small draft model for a pretrained target (`specdec.zoo.small_draft`): its shape is validated, it speaks the
target's vocabulary and special tokens, its embedding starts as the target's principal subspace, it learns from
the target by KL distillation, and its folder loads back as a plain transformers checkpoint."""

import numpy as np
import pytest
import torch

from specdec.zoo.small_draft import SmallDraftShape, build_small_draft, pca_embedding

transformers = pytest.importorskip("transformers")


def tiny_target(vocab: int = 96, dim: int = 48):
    config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=dim, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                      bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # peaked logits, so there is something to learn
    return model.eval()


@pytest.mark.parametrize("field, value, message", [("dim", 0, "dim"), ("layers", -1, "layers"), ("ff", 1.5, "ff"),
                                                   ("heads", 3, "not divisible by heads"),
                                                   ("kv_heads", 3, "not divisible by kv_heads")])
def test_shape_numbers_are_validated(field, value, message):
    kwargs = {"dim": 40, "layers": 1, "heads": 4, "kv_heads": 4, "ff": 64, field: value}
    with pytest.raises(ValueError, match=message):
        SmallDraftShape(**kwargs)


def test_pca_embedding_keeps_the_principal_subspace_and_the_row_norms():
    torch.manual_seed(0)
    basis = torch.linalg.qr(torch.randn(32, 32))[0]
    scales = torch.cat([torch.tensor([5.0, 4.0, 3.0, 2.0]), torch.full((28,), 0.05)])
    e = (torch.randn(500, 32) * scales) @ basis.T  # variance concentrated in 4 directions
    out = pca_embedding(e, 4)
    assert out.shape == (500, 4)
    assert float(out.norm(dim=1).mean()) == pytest.approx(float(e.norm(dim=1).mean()), rel=1e-4)
    # Gram matrices agree up to the dropped small directions: the projection keeps distances between tokens
    rel = (out @ out.T - e @ e.T).norm() / (e @ e.T).norm()
    assert rel < 0.2
    assert (pca_embedding(e, 1) @ pca_embedding(e, 1).T - e @ e.T).norm() / (e @ e.T).norm() > rel  # fewer: worse
    with pytest.raises(ValueError, match="dim must be in"):
        pca_embedding(e, 33)


def test_draft_speaks_the_targets_vocabulary_and_tokens():
    target = tiny_target()
    draft = build_small_draft(target, SmallDraftShape(dim=16, layers=1, heads=2, kv_heads=2, ff=32))
    c = draft.config
    assert (c.vocab_size, c.bos_token_id, c.eos_token_id, c.pad_token_id) == (96, 1, 2, 0)
    assert c.num_hidden_layers == 1 and c.hidden_size == 16 and c.tie_word_embeddings
    assert draft.lm_head.weight.data_ptr() == draft.model.embed_tokens.weight.data_ptr()
    logits = draft(torch.tensor([[1, 5, 7]])).logits
    assert logits.shape == (1, 3, 96)
    assert 0.2 < float(logits.std()) < 5.0  # a sane start for distillation (not tens of nats of KL)


def test_distillation_raises_alpha_and_the_folder_loads_back(tmp_path):
    from specdec.loading import load_model
    from specdec.zoo.data import TokenData
    from specdec.zoo.distill import distill_draft
    from specdec.zoo.presets import DistillConfig, TrainConfig
    from specdec.zoo.models import save_model

    target = tiny_target()
    rng = np.random.default_rng(0)
    with torch.no_grad():  # the target's own greedy text, as in the real recipe (answers by the target)
        ids = torch.tensor([[1]])
        for _ in range(600):
            logits = target(ids[:, -64:]).logits[0, -1]
            nxt = int(torch.multinomial(torch.softmax(logits, -1), 1)) if rng.random() < 0.3 else int(logits.argmax())
            ids = torch.cat([ids, torch.tensor([[nxt]])], 1)
    stream = ids[0].numpy().astype(np.uint16)
    data = TokenData(stream[:500], stream[500:], tmp_path, {"corpus": "code"})
    draft = build_small_draft(target, SmallDraftShape(dim=16, layers=1, heads=2, kv_heads=2, ff=32))
    cfg = DistillConfig(TrainConfig(steps=60, batch_size=8, seq_len=32, lr=1e-2, warmup_steps=5, weight_decay=0.0,
                                    z_loss=0.0, eval_every=1000, compile=False), alpha_batches=2)
    result = distill_draft(target, draft, data, cfg, device="cpu", progress=False)
    assert result.alpha_after[1.0] > result.alpha_before[1.0] + 0.05
    save_model(draft, tmp_path / "draft", None, dtype="bfloat16")
    loaded = load_model(tmp_path / "draft", device="cpu", dtype="float32", what="draft")
    x = torch.tensor([[1, 4, 9, 3]])
    expected = draft.to(torch.bfloat16).float()(x).logits
    assert torch.allclose(loaded(x).logits, expected, atol=1e-4)
