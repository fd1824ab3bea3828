"""The HTTP app in-process on tiny checkpoints: a model that produces NaN logits gets a clear 500 (its message, not
an exception's name) and /health turns 503; --api-key seen by the official async client; --seed makes unseeded
requests reproducible."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

import specdec  # noqa: E402
from specdec.server import create_app  # noqa: E402
from specdec.server.guard import GuardConfig  # noqa: E402


@pytest.fixture(scope="module")
def nan_checkpoint(tmp_path_factory, checkpoints):
    import shutil

    import torch
    import transformers

    folder = tmp_path_factory.mktemp("nan") / "nan"
    shutil.copytree(checkpoints["good"], folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    with torch.no_grad():
        model.lm_head.weight[3, :] = float("nan")
    model.save_pretrained(folder)
    return folder


def ask(app, *requests):
    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as client:
            return [await client.request(method, path, json=body) for method, path, body in requests]
    return asyncio.run(go())


def test_nan_logits_are_a_clear_500_and_health_says_so(nan_checkpoint):
    llm = specdec.load(nan_checkpoint, max_batch_size=2)
    try:
        app = create_app(llm, model_name="nan")
        before, r, health = ask(app, ("GET", "/health", None),
                                ("POST", "/v1/completions", {"prompt": "w1 w2", "max_tokens": 3}),
                                ("GET", "/health", None))
        assert before.status_code == 200
        assert r.status_code == 500 and "NaN" in r.json()["error"]["message"]
        assert r.json()["error"]["message"].startswith("generation failed: target logits")
        assert health.status_code == 503 and "NaN" in health.json()["error"]
    finally:
        llm.close()


def test_api_key_with_the_official_async_client(checkpoints):
    openai = pytest.importorskip("openai")
    llm = specdec.load(checkpoints["good"], max_batch_size=2)
    try:
        app = create_app(llm, model_name="tiny", guard=GuardConfig(api_key="k-123"))

        async def go():
            results = []
            for key in ("wrong", "k-123"):
                http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:8000")
                client = openai.AsyncOpenAI(base_url="http://127.0.0.1:8000/v1", api_key=key, http_client=http,
                                            max_retries=0)
                try:
                    got = await client.completions.create(model="tiny", prompt="w1 w2", max_tokens=3, temperature=0)
                    results.append(got.choices[0].text)
                except openai.AuthenticationError as err:
                    results.append(err)
                await http.aclose()
            return results

        wrong, right = asyncio.run(go())
        assert isinstance(wrong, Exception) and "API key" in str(wrong)
        assert isinstance(right, str)
    finally:
        llm.close()


def test_a_server_seed_makes_unseeded_requests_reproducible(checkpoints):
    body = {"prompt": "w1 w2", "max_tokens": 6, "temperature": 1.0}
    texts = []
    for _ in range(2):
        llm = specdec.load(checkpoints["good"], max_batch_size=2)
        try:
            app = create_app(llm, model_name="tiny", default_seed=7)
            texts.append([r.json()["choices"][0]["text"] for r in ask(app, *[("POST", "/v1/completions", body)] * 3)])
        finally:
            llm.close()
    assert texts[0] == texts[1] and len(set(texts[0])) > 1
