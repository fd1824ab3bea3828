"""The official `openai` client against a live `specdec serve` on the demo pair."""

from __future__ import annotations

import concurrent.futures
import json

import time

import pytest

openai = pytest.importorskip("openai")
import httpx  # noqa: E402

PROMPTS = [
    "def fibonacci(n):\n    if",
    "import os\nimport sys\n\n\ndef main(argv=None):\n    parser =",
    "class Stack:\n    def __init__(self):\n        self.",
    "def read_lines(path):\n    with open(",
]
MODEL = (("model_name", "demo"),)  # the label every metric carries


def labels(**kw) -> tuple:
    return tuple(sorted({"model_name": "demo", **kw}.items()))


MESSAGES = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "A function that adds."}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_health_models_and_playground(server, client):
    assert httpx.get(server + "/health").json()["status"] == "ok"
    assert [m.id for m in client.models.list().data] == ["demo"]
    page = httpx.get(server + "/")
    assert page.status_code == 200 and "specdec playground" in page.text


@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_greedy_completion_equals_the_text_api(client, local_llm, prompt):
    got = client.completions.create(model="demo", prompt=prompt, max_tokens=24, temperature=0)
    want = local_llm.generate(prompt, max_new_tokens=24, temperature=0)
    choice = got.choices[0]
    assert choice.text == want.text and choice.finish_reason == want.finish_reason
    assert got.usage.completion_tokens == len(want.token_ids)
    assert got.usage.prompt_tokens == len(want.prompt_token_ids)
    extra = got.model_extra["specdec"]
    assert extra["num_draft_tokens_per_step"] == 4 and extra["num_draft_tokens"] > 0
    assert 1.0 <= extra["accepted_per_step"] <= 5.0


def test_several_prompts_in_one_request_give_choices_in_order(client):
    both = client.completions.create(model="demo", prompt=PROMPTS[:2], max_tokens=10, temperature=0)
    singles = [client.completions.create(model="demo", prompt=p, max_tokens=10, temperature=0) for p in PROMPTS[:2]]
    assert [c.index for c in both.choices] == [0, 1]
    assert [c.text for c in both.choices] == [s.choices[0].text for s in singles]
    assert both.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)
    streamed = ["", ""]
    for chunk in client.completions.create(model="demo", prompt=PROMPTS[:2], max_tokens=10, temperature=0, stream=True):
        streamed[chunk.choices[0].index] += chunk.choices[0].text
    assert streamed == [c.text for c in both.choices]


def test_streamed_completion_concatenates_to_the_full_text(client):
    full = client.completions.create(model="demo", prompt=PROMPTS[2], max_tokens=20, temperature=0)
    chunks = list(client.completions.create(model="demo", prompt=PROMPTS[2], max_tokens=20, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == full.choices[0].text
    assert chunks[-1].choices[0].finish_reason == full.choices[0].finish_reason
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])


def test_chat_with_a_template_streamed_and_not(client, local_llm):
    want = local_llm.generate(MESSAGES, max_new_tokens=16, temperature=0)
    got = client.chat.completions.create(model="demo", messages=MESSAGES, max_tokens=16, temperature=0)
    assert got.choices[0].message.role == "assistant" and got.choices[0].message.content == want.text
    assert got.usage.prompt_tokens == len(want.prompt_token_ids)
    stream = client.chat.completions.create(model="demo", messages=MESSAGES, max_tokens=16, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want.text
    assert chunks[-1].usage.completion_tokens == len(want.token_ids)


def test_stop_strings_seed_and_logprobs(client, local_llm):
    full = local_llm.generate(PROMPTS[0], max_new_tokens=24, temperature=0).text
    stop = full.strip().split()[1]
    got = client.completions.create(model="demo", prompt=PROMPTS[0], max_tokens=24, temperature=0, stop=[stop])
    assert got.choices[0].text == full[: full.index(stop)] and got.choices[0].finish_reason == "stop"
    a, b = (client.completions.create(model="demo", prompt=PROMPTS[1], max_tokens=12, temperature=0.8, seed=7,
                                      logprobs=0) for _ in range(2))
    assert a.choices[0].text == b.choices[0].text
    lps = a.choices[0].logprobs.token_logprobs
    assert len(lps) == a.usage.completion_tokens and all(lp <= 0 for lp in lps)
    chat = client.chat.completions.create(model="demo", messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True)
    assert len(chat.choices[0].logprobs.content) == chat.usage.completion_tokens


def test_sixteen_concurrent_streams_equal_their_full_texts(client, idle):
    prompts = [PROMPTS[i % 4] + " " * (i // 4) for i in range(16)]

    def full(p):
        return client.completions.create(model="demo", prompt=p, max_tokens=12, temperature=0).choices[0].text

    def stream(p):
        chunks = client.completions.create(model="demo", prompt=p, max_tokens=12, temperature=0, stream=True)
        return "".join(c.choices[0].text for c in chunks)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        streamed = list(pool.map(stream, prompts))
        whole = list(pool.map(full, prompts))
    assert streamed == whole
    idle()


def _metrics_when(read_metrics, ready, timeout: float = 5.0) -> dict:
    """The server's metrics once `ready(values)` holds (or, at the timeout, as they are: the caller asserts)."""
    deadline = time.time() + timeout
    values = read_metrics()
    while not ready(values) and time.time() < deadline:
        time.sleep(0.02)
        values = read_metrics()
    return values


def test_client_disconnect_aborts_the_request_and_frees_its_slot(server, idle, read_metrics):
    before = idle()
    body = {"model": "demo", "prompt": PROMPTS[1], "max_tokens": 1000, "temperature": 0, "stream": True}
    with httpx.stream("POST", server + "/v1/completions", json=body, timeout=30) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                break  # one chunk arrived: the request is running; leave
    idle(timeout=5)
    aborted = ("specdec:request_aborted_total", MODEL)
    # the slot frees inside the engine's step, the abort is counted when the driver thread reads its outputs
    # right after: a scrape in between sees the server idle with the abort not yet counted
    after = _metrics_when(read_metrics, lambda v: v[aborted] >= before[aborted] + 1)
    assert after[aborted] == before[aborted] + 1
    generated = ("specdec:generation_tokens_total", MODEL)
    assert after[generated] - before[generated] < 1000
    # a non-streamed request whose client gives up is cancelled too
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server + "/v1/completions", json={**body, "stream": False}, timeout=1.0)
    idle(timeout=5)
    final = _metrics_when(read_metrics, lambda v: v[aborted] >= after[aborted] + 1)
    assert final[aborted] == after[aborted] + 1 and final[generated] - after[generated] < 1000


def test_metrics_parse_and_add_up_to_the_responses(server, client, idle, read_metrics):
    before = idle()
    names = {"specdec:spec_decode_num_drafts", "specdec:spec_decode_num_draft_tokens",
             "specdec:spec_decode_num_accepted_tokens", "specdec:spec_decode_num_accepted_tokens_per_pos",
             "specdec:num_requests_running", "specdec:num_requests_waiting",
             "specdec:time_to_first_token_seconds", "specdec:inter_token_latency_seconds"}
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name for f in text_string_to_metric_families(httpx.get(server + "/metrics").text)}
    assert names <= families
    sums = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0}
    per_pos: list[int] = []
    for i, prompt in enumerate(PROMPTS):
        got = client.completions.create(model="demo", prompt=prompt, max_tokens=12 + i, temperature=0)
        extra = got.model_extra["specdec"]
        for key in sums:
            sums[key] += extra[key]
        for j, n in enumerate(extra["accepted_per_position"]):
            per_pos += [0] * (j + 1 - len(per_pos))
            per_pos[j] += n
    # plain requests add no drafts
    client.completions.create(model="demo", prompt=PROMPTS[0], max_tokens=8, extra_body={"specdec": {"num_draft_tokens": 0}})
    after = idle()

    def delta(name, labelled=MODEL):
        return after.get((name, labelled), 0) - before.get((name, labelled), 0)

    assert delta("specdec:spec_decode_num_drafts_total") == sums["num_drafts"] > 0
    assert delta("specdec:spec_decode_num_draft_tokens_total") == sums["num_draft_tokens"]
    assert delta("specdec:spec_decode_num_accepted_tokens_total") == sums["num_accepted_tokens"]
    for j, n in enumerate(per_pos):
        assert delta("specdec:spec_decode_num_accepted_tokens_per_pos_total", labels(position=str(j))) == n
    assert delta("specdec:request_success_total", labels(finished_reason="length")) == 5
    assert delta("specdec:time_to_first_token_seconds_count") == 5
    assert sum(v for (n, _), v in after.items() if n == "specdec:inter_token_latency_seconds_count") > 0


def test_plain_and_speculative_requests_give_the_same_greedy_text(client):
    kw = dict(model="demo", prompt=PROMPTS[3], max_tokens=20, temperature=0)
    plain = client.completions.create(**kw, extra_body={"specdec": {"num_draft_tokens": 0}})
    spec = client.completions.create(**kw)
    assert plain.choices[0].text == spec.choices[0].text
    assert plain.model_extra["specdec"]["num_draft_tokens"] == 0 < spec.model_extra["specdec"]["num_draft_tokens"]


def test_the_token_details_stream_colours_every_token(server):
    body = {"model": "demo", "prompt": PROMPTS[0], "max_tokens": 16, "temperature": 0, "stream": True,
            "specdec": {"token_details": True}}
    text, pieces = "", []
    with httpx.stream("POST", server + "/v1/completions", json=body, timeout=30) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                text += chunk["choices"][0]["text"]
                pieces += chunk["specdec"]["tokens"]
    assert "".join(p["text"] for p in pieces) == text
    assert {p["kind"] for p in pieces} <= {"accepted", "resampled", "bonus", "plain"}
    assert any(p["kind"] == "accepted" for p in pieces)
