"""Fields the server honours beyond the basics, checked against the text API or against each other: n > 1, echo,
stop_token_ids, ignore_eos, return_token_ids, request_id, truncate_prompt_tokens, add_special_tokens, the server's
speculative_decoding object."""

from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai")
import httpx  # noqa: E402

PROMPT = "def fibonacci(n):\n    if"


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=60)


def post(server, body, path="/v1/completions"):
    r = httpx.post(server + path, json={"model": "demo", **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_n_choices_are_independent_requests_sharing_the_prompt(client, local_llm):
    greedy = client.completions.create(model="demo", prompt=PROMPT, max_tokens=8, temperature=0, n=3)
    want = local_llm.generate(PROMPT, max_new_tokens=8, temperature=0).text
    assert [c.index for c in greedy.choices] == [0, 1, 2] and {c.text for c in greedy.choices} == {want}
    assert greedy.usage.prompt_tokens == len(local_llm.tokenizer.encode(PROMPT))  # the prompt counts once
    assert greedy.usage.completion_tokens == 3 * 8 or greedy.usage.completion_tokens <= 24
    sampled = [client.completions.create(model="demo", prompt=PROMPT, max_tokens=12, temperature=1.0, n=4, seed=5)
               for _ in range(2)]
    texts = [c.text for c in sampled[0].choices]
    assert texts == [c.text for c in sampled[1].choices]  # a seed makes the n choices reproducible
    assert len(set(texts)) > 1  # and they are different draws
    # choice j is the request seeded seed + j
    assert texts[1] == local_llm.generate(PROMPT, max_new_tokens=12, temperature=1.0, seed=6).text
    chat = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "add"}], max_tokens=4,
                                          temperature=0, n=2, stream=True)
    seen = {}
    for chunk in chat:
        for c in chunk.choices:
            seen[c.index] = seen.get(c.index, "") + (c.delta.content or "")
    assert sorted(seen) == [0, 1] and seen[0] == seen[1]


def test_echo_prepends_the_prompt_streamed_or_not(server, client):
    full = client.completions.create(model="demo", prompt=PROMPT, max_tokens=6, temperature=0, echo=True)
    plain = client.completions.create(model="demo", prompt=PROMPT, max_tokens=6, temperature=0)
    assert full.choices[0].text == PROMPT + plain.choices[0].text
    chunks = client.completions.create(model="demo", prompt=PROMPT, max_tokens=6, temperature=0, echo=True, stream=True)
    assert "".join(c.choices[0].text for c in chunks) == full.choices[0].text


def test_stop_token_ids_ignore_eos_and_token_ids(server, local_llm):
    base = post(server, {"prompt": PROMPT, "max_tokens": 10, "temperature": 0, "return_token_ids": True})
    choice = base["choices"][0]
    assert choice["prompt_token_ids"] == local_llm.tokenizer.encode(PROMPT)
    ids = choice["token_ids"]
    assert len(ids) == base["usage"]["completion_tokens"]
    stop_at = next(i for i, t in enumerate(ids) if t not in ids[:i] and i >= 2)
    cut = post(server, {"prompt": PROMPT, "max_tokens": 10, "temperature": 0, "return_token_ids": True,
                        "stop_token_ids": [ids[stop_at]]})["choices"][0]
    assert cut["token_ids"] == ids[: stop_at + 1] and cut["finish_reason"] == "stop"
    # ignore_eos: the model's EOS no longer ends the text (stop_token_ids still do)
    eos = local_llm.defaults.eos_token_ids[0]
    forced = post(server, {"prompt": [eos], "max_tokens": 5, "temperature": 0, "ignore_eos": True,
                           "stop_token_ids": [], "return_token_ids": True})["choices"][0]
    assert len(forced["token_ids"]) == 5 and forced["finish_reason"] == "length"


def test_request_id_truncation_and_special_tokens(server, local_llm):
    got = post(server, {"prompt": PROMPT, "max_tokens": 2, "temperature": 0, "request_id": "abc-1",
                        "truncate_prompt_tokens": 3, "return_token_ids": True})
    assert got["id"] == "cmpl-abc-1"
    assert got["choices"][0]["prompt_token_ids"] == local_llm.tokenizer.encode(PROMPT)[-3:]
    assert got["usage"]["prompt_tokens"] == 3
    plain = post(server, {"prompt": PROMPT, "max_tokens": 2, "add_special_tokens": False, "return_token_ids": True})
    assert plain["choices"][0]["prompt_token_ids"] == local_llm.tokenizer.encode(PROMPT, add_special_tokens=False)


def test_speculative_decoding_counters_in_every_response(server):
    got = post(server, {"prompt": PROMPT, "max_tokens": 16, "temperature": 0, "n": 2})
    spec, extra = got["speculative_decoding"], got["specdec"]
    assert spec["num_drafts"] == extra["num_drafts"] > 0
    assert spec["num_draft_tokens"] == extra["num_draft_tokens"]
    assert spec["num_accepted_tokens"] == extra["num_accepted_tokens"] == sum(spec["num_accepted_tokens_per_pos"])
    assert spec["mean_acceptance_length"] == pytest.approx(1 + spec["num_accepted_tokens"] / spec["num_drafts"])
    body = {"model": "demo", "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "stream": True}
    last = None
    with httpx.stream("POST", server + "/v1/completions", json=body, timeout=30) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                last = json.loads(line[6:])
    assert last["choices"][0]["finish_reason"] is not None and last["speculative_decoding"]["num_drafts"] > 0


def test_top_n_logprobs_are_the_targets_most_likely_tokens(client, local_llm):
    """Completions logprobs N (≤ 5) and chat top_logprobs N (≤ 20): the N most likely tokens of the target's raw law
    at each generated token, greedy or sampled — the text API's (engine or transformers loop)."""
    want = local_llm.generate(PROMPT, max_new_tokens=6, temperature=0, logprobs=True, top_logprobs=3)
    got = client.completions.create(model="demo", prompt=PROMPT, max_tokens=6, temperature=0, logprobs=3)
    lp = got.choices[0].logprobs
    assert lp.token_logprobs == pytest.approx(want.logprobs, abs=1e-5)
    decode = local_llm.tokenizer.decode
    for entry, alternatives, token in zip(lp.top_logprobs, want.top_logprobs, lp.tokens):
        assert entry == pytest.approx({decode([t]): v for t, v in alternatives}, abs=1e-5)
        assert token in entry  # greedy: the chosen token is the most likely one
    sampled = client.completions.create(model="demo", prompt=PROMPT, max_tokens=8, temperature=1.0, seed=3, logprobs=2)
    lp = sampled.choices[0].logprobs
    assert all(2 <= len(d) <= 3 and d.get(t, lp_t) == pytest.approx(lp_t, abs=1e-5)  # N, + the chosen if not in them
               for d, t, lp_t in zip(lp.top_logprobs, lp.tokens, lp.token_logprobs))
    assert all(max(d.values()) >= lp_t - 1e-6 for d, lp_t in zip(lp.top_logprobs, lp.token_logprobs))
    chat = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "add"}], max_tokens=4,
                                          temperature=0.8, seed=2, logprobs=True, top_logprobs=20)
    for entry in chat.choices[0].logprobs.content:
        values = [t.logprob for t in entry.top_logprobs]
        assert len(values) == 20 and values == sorted(values, reverse=True)
        # the chosen token is among them, or less likely than all 20
        assert entry.token in [t.token for t in entry.top_logprobs] or entry.logprob <= values[-1] + 1e-6
    streamed = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "add"}],
                                              max_tokens=4, temperature=0, logprobs=True, top_logprobs=2, stream=True)
    entries = [e for c in streamed for e in (c.choices[0].logprobs.content if c.choices and c.choices[0].logprobs
                                               else [])]
    assert entries and all(len(e.top_logprobs) == 2 and e.top_logprobs[0].token == e.token for e in entries)


def test_min_p_is_the_text_apis(client, local_llm):
    kw = dict(max_tokens=12, temperature=1.0, seed=11)
    got = client.completions.create(model="demo", prompt=PROMPT, extra_body={"min_p": 0.2}, **kw).choices[0].text
    assert got == local_llm.generate(PROMPT, max_new_tokens=12, temperature=1.0, seed=11, min_p=0.2).text


@pytest.mark.parametrize("fields", [
    {"repetition_penalty": 1.6},
    {"frequency_penalty": 2.0, "presence_penalty": 2.0},
    {"logit_bias": {"7": 30.0}, "min_tokens": 6},
    {"allowed_token_ids": list(range(250, 400)), "repetition_penalty": 1.2},
    {"bad_words": ["return", "fibonacc"]},
])
def test_logits_processors_are_the_text_apis(server, local_llm, fields):
    """Penalties, logit_bias and min_tokens through the server give the text API's output with the same
    processors (itself equal to transformers' processed greedy decoding: tests/test_processing.py), and change it."""
    got = post(server, {"prompt": PROMPT, "max_tokens": 24, "temperature": 0, "return_token_ids": True, **fields})
    kwargs = {k: ({int(t): b for t, b in v.items()} if k == "logit_bias" else v) for k, v in fields.items()}
    if "bad_words" in kwargs:  # the text API takes token sequences: each word with and without a leading space
        encode = local_llm.tokenizer.encode
        kwargs["bad_words_ids"] = [encode(t, add_special_tokens=False) for w in kwargs.pop("bad_words")
                                   for t in (w, " " + w)]
    want = local_llm.generate(PROMPT, max_new_tokens=24, temperature=0, **kwargs)
    plain = local_llm.generate(PROMPT, max_new_tokens=24, temperature=0)
    assert got["choices"][0]["token_ids"] == want.token_ids
    assert want.token_ids != plain.token_ids
    if "logit_bias" in fields:
        assert 7 in want.token_ids
    if "bad_words" in fields:
        assert "return" not in want.text and "return" in plain.text
    if "allowed_token_ids" in fields:
        assert set(want.token_ids) <= set(fields["allowed_token_ids"])


def test_draft_tree_and_leniency_are_the_text_apis(server, local_llm):
    """specdec.draft_tree: greedy text = plain decoding's, a sampled text = the text API's with the same tree and
    seed, and the response counts a tree's nodes per step (6 for [2, 2], not the chain's γ); specdec.leniency: the
    text API's lenient text, which is not the exact one."""
    body = {"prompt": PROMPT, "max_tokens": 24, "return_token_ids": True}
    greedy = post(server, {**body, "temperature": 0, "specdec": {"draft_tree": [2, 2]}})
    assert greedy["choices"][0]["token_ids"] == local_llm.generate(PROMPT, max_new_tokens=24, temperature=0).token_ids
    spec = greedy["speculative_decoding"]
    assert spec["num_draft_tokens"] == 6 * spec["num_drafts"] > 0
    kw = dict(max_new_tokens=24, temperature=1.0, seed=5)
    tree = post(server, {**body, "temperature": 1.0, "seed": 5, "specdec": {"draft_tree": [2, 2]}})
    assert tree["choices"][0]["token_ids"] == local_llm.generate(PROMPT, draft_tree=(2, 2), **kw).token_ids
    lenient = post(server, {**body, "temperature": 1.0, "seed": 5, "specdec": {"leniency": 0.3}})
    exact = local_llm.generate(PROMPT, **kw).token_ids
    assert lenient["choices"][0]["token_ids"] == local_llm.generate(PROMPT, leniency=0.3, **kw).token_ids != exact


@pytest.mark.parametrize("specdec, field, words", [
    ({"draft_tree": [2, 2], "leniency": 0.5}, "specdec.draft_tree", "leniency"),
    ({"draft_tree": [2], "num_draft_tokens": 0}, "specdec.draft_tree", "plain decoding"),
    ({"leniency": 0.5, "num_draft_tokens": 0}, "specdec.leniency", "plain decoding"),
    ({"draft_tree": [8, 8]}, "draft_tree [8, 8]", "max_tree_nodes"),
    ({"draft_tree": [0, 2]}, "specdec.draft_tree[0]", "greater than or equal to 1"),
    ({"leniency": 0}, "specdec.leniency", "greater than 0"),
    ({"leniency": 1.5}, "specdec.leniency", "less than or equal to 1"),
])
def test_draft_tree_and_leniency_refusals_name_the_problem(server, specdec, field, words):
    r = httpx.post(server + "/v1/completions", json={"model": "demo", "prompt": PROMPT, "max_tokens": 4,
                                                     "specdec": specdec}, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert field in error["message"] and words in error["message"], error
    if field.startswith("specdec"):
        assert error["param"] == "specdec"


def test_any_num_draft_tokens_up_to_the_engines_largest_runs_on_the_one_engine(server, local_llm):
    """specdec.num_draft_tokens: 0 (plain), the server's default (4) and other values run on its one engine (no
    engine per γ): greedy text is plain decoding's, each step of a request drafts at most its γ and what its budget can
    still commit; past the engine's max_draft_tokens a 400 names the range."""
    body = {"prompt": PROMPT, "max_tokens": 16, "temperature": 0, "return_token_ids": True}
    want = local_llm.generate(PROMPT, max_new_tokens=16, temperature=0, num_draft_tokens=0).token_ids
    for gamma in (0, 2, 4, 8):
        out = post(server, {**body, "specdec": {"num_draft_tokens": gamma}})
        spec = out["speculative_decoding"]
        assert out["choices"][0]["token_ids"] == want, gamma
        assert spec["num_draft_tokens"] <= gamma * spec["num_drafts"] and (spec["num_draft_tokens"] > 0) == (gamma > 0)
    r = httpx.post(server + "/v1/completions", json={"model": "demo", **body, "specdec": {"num_draft_tokens": 9}},
                   timeout=60)
    assert r.status_code == 400 and "[0, 8]" in r.json()["error"]["message"], r.text
