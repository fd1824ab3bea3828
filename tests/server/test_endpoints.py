"""The server's other endpoints against the live server: /version, /tokenize, /detokenize (vLLM's shapes),
/docs and /openapi.json, /v1/responses through the official client, /metrics without `_created` series, and
the start-up's phase lines on stderr."""

from __future__ import annotations

import io

import pytest

openai = pytest.importorskip("openai")
import httpx  # noqa: E402

MESSAGES = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "A function that adds."}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_version(server):
    import specdec

    assert httpx.get(server + "/version").json() == {"version": specdec.__version__}


def test_tokenize_and_detokenize_a_prompt(server, local_llm):
    prompt = "def fibonacci(n):\n    return"
    got = httpx.post(server + "/tokenize", json={"model": "demo", "prompt": prompt, "return_token_strs": True}).json()
    want = local_llm.tokenizer.encode(prompt)
    assert got == {"count": len(want), "max_model_len": local_llm.max_seq_len, "tokens": want,
                   "token_strs": local_llm.tokenizer.convert_ids_to_tokens(want)}
    assert httpx.post(server + "/detokenize", json={"tokens": want}).json() == {
        "prompt": local_llm.tokenizer.decode(want)}


def test_tokenize_messages_counts_what_chat_sends(server, client):
    got = httpx.post(server + "/tokenize", json={"messages": MESSAGES}).json()
    assert got["token_strs"] is None
    answer = client.chat.completions.create(model="demo", messages=MESSAGES, max_tokens=2, temperature=0)
    assert got["count"] == answer.usage.prompt_tokens == len(got["tokens"])


@pytest.mark.parametrize("path, body, param", [
    ("/tokenize", {"prompt": 5}, "prompt"), ("/tokenize", {"prompt": "x", "truncate": 1}, "truncate"),
    ("/tokenize", {"prompt": "x", "model": "gpt-4"}, "model"), ("/detokenize", {"tokens": [10**7]}, "tokens"),
    ("/detokenize", {"tokens": "abc"}, "tokens"),
])
def test_bad_tokenize_requests_name_the_field(server, path, body, param):
    r = httpx.post(server + path, json=body)
    assert r.status_code in (400, 404) and r.json()["error"]["param"] == param, r.text


def test_docs_and_the_openapi_schema_are_served(server):
    schema = httpx.get(server + "/openapi.json").json()
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/responses", "/tokenize", "/detokenize", "/version"):
        assert path in schema["paths"], path
    body = schema["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    chat = schema["components"]["schemas"][body["$ref"].rsplit("/", 1)[1]]
    assert {"messages", "tools", "tool_choice", "max_tokens"} <= set(chat["properties"])
    assert "swagger" in httpx.get(server + "/docs").text.lower()


def test_docs_can_be_switched_off(local_llm):
    from starlette.testclient import TestClient

    from specdec.server import create_app

    with TestClient(create_app(local_llm, model_name="demo", docs=False), base_url="http://127.0.0.1") as app:
        assert app.get("/docs").status_code == 404 and app.get("/openapi.json").status_code == 404
        assert app.get("/version").status_code == 200


def test_metrics_have_no_created_series(server, client):
    client.completions.create(model="demo", prompt="def f(", max_tokens=2)
    text = httpx.get(server + "/metrics").text
    assert "_created" not in text and "specdec:spec_decode_num_drafts_total" in text


def test_responses_runs_the_chat_path(client):
    got = client.responses.create(model="demo", instructions="You write Python.", input="A function that adds.",
                                  max_output_tokens=12, temperature=0)
    chat = client.chat.completions.create(model="demo", messages=MESSAGES, max_tokens=12, temperature=0)
    assert got.output_text == chat.choices[0].message.content and got.object == "response"
    assert got.usage.input_tokens == chat.usage.prompt_tokens and got.usage.output_tokens == 12
    assert got.status == "incomplete" and got.incomplete_details.reason == "max_output_tokens"
    parts = [{"role": "user", "content": [{"type": "input_text", "text": "A function that adds."}]}]
    again = client.responses.create(model="demo", instructions="You write Python.", input=parts, max_output_tokens=12,
                                    temperature=0)
    assert again.output_text == got.output_text


def test_responses_streams_openai_events(client):
    kinds, text = [], ""
    for event in client.responses.create(model="demo", input="def add(a, b):", max_output_tokens=10, temperature=0,
                                         stream=True):
        kinds.append(event.type)
        text += getattr(event, "delta", "") if event.type == "response.output_text.delta" else ""
        if event.type == "response.incomplete":
            final = event.response
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    whole = client.responses.create(model="demo", input="def add(a, b):", max_output_tokens=10, temperature=0)
    assert text == final.output_text == whole.output_text


@pytest.mark.parametrize("field, value", [("previous_response_id", "resp_1"), ("store", True),
                                          ("tools", [{"type": "web_search"}]), ("reasoning", {"effort": "low"}),
                                          ("include", ["reasoning.encrypted_content"])])
def test_responses_refuses_what_a_stateless_server_cannot_do(client, field, value):
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="demo", input="x", max_output_tokens=2, **{field: value})
    assert field in str(info.value)


def test_start_up_says_each_phase(server_log):
    text = server_log.read_text()
    lines = [line for line in text.splitlines() if line.startswith("specdec serve [")]
    for fragment in ("target: loading", "target: loaded", "draft: loaded", "drafter:", "KV cache:", "warm-up:",
                     "ready: demo"):
        assert any(fragment in line for line in lines), (fragment, text)
    assert "objects frozen" not in text
    kv = next(line for line in lines if "KV cache:" in line)
    assert "16 sequences" in kv and "drafter" in kv and ("GiB" in kv or "MiB" in kv)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_start_up_log_draws_a_progress_bar_on_a_terminal_only():
    import logging

    from specdec.cli.serve_startup import StartupLog

    for stream, bar in ((_Terminal(), True), (io.StringIO(), False)):
        log = StartupLog(stream=stream).install()
        try:
            logging.getLogger("specdec.text.warmup").info("warm-up: capturing 3 shapes")
            for done in (1, 2, 3):
                logging.getLogger("specdec.text.warmup").debug("warm-up", extra={"progress": (done, 3)})
        finally:
            log.uninstall()
        out = stream.getvalue()
        assert "warm-up: capturing 3 shapes" in out and ("3/3" in out) == bar, out
    quiet = io.StringIO()
    log = StartupLog(stream=quiet, quiet=True).install()
    logging.getLogger("specdec.loading").info("target: loading x")
    log.uninstall()
    assert quiet.getvalue() == "" and not logging.getLogger("specdec").handlers


def test_metrics_export_the_kv_cache_usage(server, read_metrics):
    values = read_metrics()
    assert 0.0 <= values[("specdec:kv_cache_usage_perc", (("model_name", "demo"),))] <= 1.0
    assert values[("specdec:num_preemptions_total", (("model_name", "demo"),))] == 0  # a static cache never preempts


def test_a_paged_pool_exports_its_blocks():
    from pathlib import Path

    from prometheus_client.parser import text_string_to_metric_families
    from transformers import AutoModelForCausalLM

    from specdec.engine import Engine, EngineConfig
    from specdec.server.metrics import ServerMetrics

    folder = Path(__file__).resolve().parents[2] / "specdec" / "assets" / "demo_pair" / "target"
    target = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    engine = Engine(target, None, EngineConfig(max_batch_size=2, max_seq_len=64, num_draft_tokens=0,
                                               kv_layout="paged", kv_cache_memory=1 << 22))

    class LLM:  # what ServerMetrics reads of an LLM
        num_running = num_waiting = 0

    metrics = ServerMetrics(LLM())
    metrics.watch_runner(engine)
    samples = {s.name: s.value for f in text_string_to_metric_families(metrics.render().decode()) for s in f.samples}
    usage = engine.kv_cache_usage
    assert samples["specdec:kv_cache_free_blocks"] == usage.num_free_blocks > 0
    assert samples["specdec:kv_cache_used_blocks"] == usage.num_used_blocks == 0
    assert samples["specdec:kv_cache_usage_perc"] == 0.0 and samples["specdec:num_preemptions_total"] == 0
