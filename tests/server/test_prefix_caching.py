"""Prefix caching through the server, read with the official `openai` client: a live `specdec serve
--enable-prefix-caching` reports OpenAI's `usage.prompt_tokens_details.cached_tokens` in completions, chat and the
streaming usage chunk, and vLLM's `prefix_cache_queries` / `prefix_cache_hits` counters in /metrics (under the
server's prefix); a repeated prompt's answer is the same with or without the hit. The negative control: a server
started with --no-prefix-caching reports 0 cached tokens for the same repeated prompt, its counters at 0."""

from __future__ import annotations

import httpx
import pytest

openai = pytest.importorskip("openai")

MODEL = (("model_name", "demo"),)
# a long shared prefix (several 16-position blocks), then a short distinct tail
PREFIX = "".join(f"def helper_{i}(x):\n    return x + {i}\n\n" for i in range(12))
MESSAGES = [{"role": "system", "content": "You write Python. " + PREFIX},
            {"role": "user", "content": "A function that adds."}]


@pytest.fixture(scope="module")
def cached_server(start_server):
    with start_server("serve_prefix.log", "--enable-prefix-caching") as base:
        yield base


def _client(base):
    return openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)


def _cached(usage) -> int:
    return usage.prompt_tokens_details.cached_tokens


def test_completions_chat_and_stream_report_cached_tokens(cached_server, metrics_of):
    client = _client(cached_server)
    first = client.completions.create(model="demo", prompt=PREFIX + "def main(", max_tokens=12, temperature=0)
    again = client.completions.create(model="demo", prompt=PREFIX + "def main(", max_tokens=12, temperature=0)
    assert _cached(first.usage) == 0
    assert 16 <= _cached(again.usage) < again.usage.prompt_tokens and _cached(again.usage) % 16 == 0
    assert again.choices[0].text == first.choices[0].text  # the hit gives the same greedy answer
    other = client.completions.create(model="demo", prompt=PREFIX + "class Node:", max_tokens=4, temperature=0)
    assert _cached(other.usage) >= _cached(again.usage) - 16  # the shared prefix's blocks, another tail

    chat = [client.chat.completions.create(model="demo", messages=MESSAGES, max_tokens=8, temperature=0)
            for _ in range(2)]
    assert _cached(chat[1].usage) >= 16 and chat[1].choices[0].message.content == chat[0].choices[0].message.content
    stream = client.chat.completions.create(model="demo", messages=MESSAGES, max_tokens=8, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[-1].usage is not None and _cached(chunks[-1].usage) == _cached(chat[1].usage)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == chat[0].choices[0].message.content

    n = client.completions.create(model="demo", prompt="# fresh " + PREFIX[::-1], max_tokens=6, temperature=1.0,
                                  seed=3, n=3)
    assert len(n.choices) == 3 and _cached(n.usage) == 0  # a fresh prompt counts once: prefilled by one choice

    values = metrics_of(cached_server)
    queries, hits = values[("specdec:prefix_cache_queries_total", MODEL)], values[("specdec:prefix_cache_hits_total", MODEL)]
    assert hits >= _cached(again.usage) + _cached(chat[1].usage) + _cached(chunks[-1].usage) and queries > hits
    text = httpx.get(cached_server + "/metrics").text
    assert 'specdec:prefix_cache_hits_total{model_name="demo"}' in text and "prefix_cache_queries_created" not in text


@pytest.fixture(scope="module")
def uncached_server(start_server):
    with start_server("serve_no_prefix.log", "--no-prefix-caching") as base:
        yield base


def test_caching_off_reports_zero(uncached_server, metrics_of):
    """Negative control: a server with --no-prefix-caching (vLLM's --no-enable-prefix-caching)."""
    server = uncached_server
    client = _client(server)
    usages = [client.completions.create(model="demo", prompt=PREFIX + "def main(", max_tokens=4, temperature=0).usage
              for _ in range(2)]
    assert [_cached(u) for u in usages] == [0, 0]
    values = metrics_of(server)
    assert values[("specdec:prefix_cache_hits_total", MODEL)] == values[("specdec:prefix_cache_queries_total", MODEL)] == 0
