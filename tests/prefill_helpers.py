"""Helpers of the chunked-prefill (mixed step) tests (tests/engine/test_mixed_*.py): prompts, a feature head, and a
driver admitting requests mid-flight."""

from specdec.request import SamplingParams


def prompt(n: int, seed: int) -> list[int]:
    return [(seed * 7 + 13 * i + (i * i) % 11) % 60 + 2 for i in range(n)]


def head(target):
    from specdec.fast.head import HeadConfig
    from specdec.fast.model import LlamaShape
    from specdec.zoo.feature_head import TrainableHead

    trainable = TrainableHead(HeadConfig.for_target(LlamaShape.from_hf(target.config)), seed=1)
    trainable.init_from(target)
    return trainable.to_feature_head()


def drive(engine, early, late, params, join_after=3, watch=None):
    """`early` requests, `join_after` steps, then `late` ones admitted mid-flight; → {request id: tokens}, ids in
    order. watch(engine, outputs) after every step."""
    ids = [engine.add_request(p, q) for p, q in zip(early, params)]
    outputs: dict = {}
    for step in range(10_000):
        if step == join_after:
            ids += [engine.add_request(p, q) for p, q in zip(late, params[len(early):])]
        if not engine.has_unfinished() and step > join_after:
            break
        outs = engine.step()
        for out in outs:
            outputs.setdefault(out.request_id, []).extend(out.new_token_ids)
        if watch is not None:
            watch(engine, outs)
    return [outputs[i] for i in ids]


def mixed_params(n: int, max_new: int = 20) -> list[SamplingParams]:
    return [SamplingParams(temperature=0 if i % 2 == 0 else 1.0, seed=100 + i, max_new_tokens=max_new)
            for i in range(n)]
