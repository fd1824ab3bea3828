"""The async scheduling tests' traffic (`tests/engine/test_async_*.py`): requests arriving at given calls, some aborted,
driven through an engine call by call, and the same traffic through a synchronous and an async engine."""

from specdec.request import SamplingParams

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12], [3, 4, 5], [7, 7, 7, 7, 8, 9, 7, 7, 7, 7, 8], [4, 4, 9], [11, 12, 13, 14]]


def _drive(engine, arrivals, aborts=None, calls=400):
    """Run `engine` over `arrivals` [(call, prompt, params)], aborting request i before call `aborts[i]` → (per
    request its tokens, its finish reason, the requests that emitted after their finish or abort, the tokens emitted
    in all, per request its log-probabilities)."""
    aborts = aborts or {}
    pending = sorted(enumerate(arrivals), key=lambda x: x[1][0])
    ids, tokens, reasons, late, logprobs = {}, {}, {}, [], {}
    for call in range(calls):
        while pending and pending[0][1][0] <= call:
            i, (_, prompt, params) = pending.pop(0)
            ids[engine.add_request(prompt, params)] = i
            tokens[i] = []
        for i, at in aborts.items():
            if at == call:
                engine.abort(next(r for r, j in ids.items() if j == i))
        for out in engine.step():
            i = ids[out.request_id]
            if i in reasons or (out.new_token_ids and aborts.get(i, calls) <= call):
                late.append(i)  # (after its finish, or tokens of a step run after its abort)
            tokens[i] += out.new_token_ids
            logprobs[i] = logprobs.get(i, []) + (out.logprobs or [])
            if out.finished:
                reasons[i] = out.finish_reason
        if not pending and not engine.has_unfinished():
            break
    else:
        raise AssertionError("the engine did not finish")
    return tokens, reasons, late, sum(len(t) for t in tokens.values()), logprobs


def _both(make, arrivals, aborts=None):
    """The same traffic through a synchronous and an async engine (`make(async_scheduling)`) → both results and
    the async engine."""
    sync = _drive(make(False), arrivals, aborts)
    engine = make(True)
    return sync, _drive(engine, arrivals, aborts), engine


def _traffic(temperature=0.0, eos=None, spread=1, n=6, new=14):
    return [(i * spread, PROMPTS[i % len(PROMPTS)],
             SamplingParams(temperature=temperature, max_new_tokens=new + 3 * (i % 4), seed=100 + i,
                            eos_token_ids=eos or ()))
            for i in range(n)]
