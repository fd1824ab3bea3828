"""Nothing cached survives a change of model (`PrefixCache.watch_weights`): another model's state dict loaded in
place into the engine's target, or the draft model's weights changed in place (its K/V live in the same blocks), clear
the index before the next hit — the repeated prompt is prefilled again (0 cached tokens) and decodes as a fresh
engine on the new weights does. Negative control: with the watch off the same prompt hits the stale blocks."""

import pytest
import torch

from specdec.engine import Engine, EngineConfig
from specdec.request import SamplingParams

PROMPT = [(5 * i + 1) % 61 + 2 for i in range(37)]


def _config(caching=True):
    return EngineConfig(max_batch_size=2, max_seq_len=96, num_draft_tokens=3, block_size=8, kv_layout="paged",
                        enable_prefix_caching=caching)


def _serve(engine, params):
    rid, tokens, final = engine.add_request(PROMPT, params), [], None
    while engine.has_unfinished():
        for out in engine.step():
            tokens += out.new_token_ids
            final = out if out.finished else final
    assert final.request_id == rid
    return tokens, final


@pytest.mark.parametrize("watch", [True, False])
def test_another_models_weights_loaded_into_the_target(make_llama, watch):
    target, other = make_llama(0), make_llama(5)
    params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=2)
    engine = Engine(target, None, _config())
    engine.prefix_cache.watch_weights = watch
    _serve(engine, params)
    with torch.no_grad():
        target.load_state_dict(other.state_dict())  # (in place: the engine computes with the new weights)
    got, final = _serve(engine, params)
    if watch:
        fresh, _ = _serve(Engine(target, None, _config(False)), params)
        assert final.num_cached_tokens == 0 and engine.prefix_cache.resets == 1 and got == fresh
    else:  # negative control: the blocks of the old model are served
        assert final.num_cached_tokens == 32 and engine.prefix_cache.resets == 0


@pytest.mark.parametrize("watch", [True, False])
def test_the_draft_models_weights_changed_in_place(make_llama, watch):
    target, draft = make_llama(0), make_llama(1, layers=1)
    params = SamplingParams(temperature=0.0, max_new_tokens=12)
    engine = Engine(target, draft, _config())
    engine.prefix_cache.watch_weights = watch
    first, _ = _serve(engine, params)
    with torch.no_grad():
        for layer in draft.model.layers:
            layer.self_attn.k_proj.weight.mul_(-2.0)
    got, final = _serve(engine, params)
    assert got == first  # greedy: the target's tokens whatever the drafter holds
    assert (final.num_cached_tokens, engine.prefix_cache.resets) == ((0, 1) if watch else (32, 0))
