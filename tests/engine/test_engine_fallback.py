"""The engine applies the γ policy's per-row caps (`GammaPolicy.row_caps`): a row the acceptance watch holds back
drafts nothing inside the same verify pass while the others draft, and every row's text stays the target's."""

from helpers import RAGGED_PROMPTS, hf_greedy
from specdec.engine import Engine, EngineConfig
from specdec.engine.acceptance import AcceptanceWatch
from specdec.request import SamplingParams


class _Hold(AcceptanceWatch):
    """Holds the request `held` at cap 0 on every step (None: holds none — the negative control)."""

    def __init__(self, held=None):
        super().__init__()
        self.held = held

    def caps(self, running):
        return [0 if r.request_id == self.held else None for r in running]


def _run(make_llama, held):
    target = make_llama(0)
    engine = Engine(target, make_llama(0), EngineConfig(max_batch_size=2, max_seq_len=128, num_draft_tokens="auto"))
    params = SamplingParams(temperature=0, max_new_tokens=20)
    ids = [engine.add_request(p, params) for p in RAGGED_PROMPTS[:2]]
    engine.policy.watch = _Hold(ids[1] if held else None)
    tokens, drafted = {i: [] for i in ids}, {i: 0 for i in ids}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
            drafted[out.request_id] += out.num_drafted
    for i, prompt in zip(ids, RAGGED_PROMPTS[:2]):  # exact at every cap: the target's greedy text
        assert tokens[i] == hf_greedy(target, prompt, 20, [])[: len(tokens[i])] and len(tokens[i]) == 20
    return [drafted[i] for i in ids]


def test_a_held_row_drafts_nothing_while_the_others_draft(make_llama):
    first, second = _run(make_llama, held=True)
    assert first > 0 and second == 0, (first, second)
    first, second = _run(make_llama, held=False)  # negative control: both rows draft
    assert first > 0 and second > 0, (first, second)
