"""Host / Origin / API key / content-type checks (`specdec.server.guard`): on a bare ASGI app, then on the live
server (a DNS-rebinding Host, a cross-site Origin and a text/plain POST never reach the model)."""

from __future__ import annotations

import asyncio

import pytest

httpx = pytest.importorskip("httpx")

from specdec.server.guard import GuardConfig, GuardMiddleware  # noqa: E402


async def _ok(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"ran"})


def call(config: GuardConfig, method="GET", path="/v1/models", headers=None, host="127.0.0.1:8000"):
    async def go():
        transport = httpx.ASGITransport(app=GuardMiddleware(_ok, config))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as client:
            h = {"host": host, **(headers or {})} if host is not None else dict(headers or {})
            return await client.request(method, path, headers=h, content=b"{}" if method == "POST" else None)
    return asyncio.run(go())


@pytest.mark.parametrize("host", ["127.0.0.1:8000", "localhost:8000", "[::1]:8000", "LOCALHOST", "127.0.0.1"])
def test_loopback_hosts_are_served(host):
    assert call(GuardConfig(), host=host).text == "ran"


@pytest.mark.parametrize("host", ["evil.example:8000", "attacker.com", "127.0.0.1.evil.com", "localhost.evil", "10.0.0.5"])
def test_other_hosts_are_refused_by_default(host):
    r = call(GuardConfig(), host=host)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_host" and "--allowed-hosts" in r.text


def test_allowed_hosts_bind_addresses_and_wildcards():
    assert call(GuardConfig(allowed_hosts=("my.box",)), host="my.box:8000").text == "ran"
    assert call(GuardConfig(bind_host="10.0.0.5"), host="10.0.0.5:8000").text == "ran"
    # bound to every interface: IP literals cannot be re-pointed by DNS; names still need --allowed-hosts
    assert call(GuardConfig(bind_host="0.0.0.0"), host="192.168.1.9:8000").text == "ran"
    assert call(GuardConfig(bind_host="0.0.0.0"), host="evil.example").status_code == 400
    assert call(GuardConfig(allowed_hosts=("*",)), host="anything").text == "ran"


def test_origins_same_machine_allowed_cross_site_refused_listed_ones_get_cors():
    assert call(GuardConfig(), headers={"origin": "http://127.0.0.1:8000"}).text == "ran"
    for origin in ("http://evil.example", "null", "file://", "http://127.0.0.1.evil.com"):
        r = call(GuardConfig(), headers={"origin": origin})
        assert r.status_code == 403 and r.json()["error"]["code"] == "invalid_origin", origin
    config = GuardConfig(allowed_origins=("https://app.example",))
    r = call(config, headers={"origin": "https://app.example"})
    assert r.text == "ran" and r.headers["access-control-allow-origin"] == "https://app.example"
    pre = call(config, method="OPTIONS", headers={"origin": "https://app.example",
                                                  "access-control-request-method": "POST"})
    assert pre.status_code == 204 and "authorization" in pre.headers["access-control-allow-headers"]


def test_api_key_bearer_required_on_the_api_not_on_health():
    config = GuardConfig(api_key="s3cret")
    assert call(config).status_code == 401
    assert call(config, headers={"authorization": "Bearer wrong"}).status_code == 401
    assert call(config, headers={"authorization": "Basic s3cret"}).status_code == 401
    assert call(config, headers={"authorization": "Bearer s3cret"}).text == "ran"
    assert call(config, headers={"authorization": "bearer s3cret"}).text == "ran"
    assert call(config, path="/metrics").status_code == 401
    assert call(config, path="/health").text == "ran"
    assert call(config).json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(ValueError, match="api_key"):
        GuardConfig(api_key="")


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                                          "application/jsonx"])
def test_a_post_must_be_json(content_type):
    headers = {"content-type": content_type} if content_type else {}
    async def go():
        transport = httpx.ASGITransport(app=GuardMiddleware(_ok, GuardConfig()))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as client:
            return await client.post("/v1/completions", content=b'{"prompt": "x"}', headers=headers)
    r = asyncio.run(go())
    assert r.status_code == 415 and "application/json" in r.json()["error"]["message"]
    assert call(GuardConfig(), method="POST", headers={"content-type": "application/json; charset=utf-8"}).text == "ran"


# --- on the live server -----------------------------------------------------------------------------

def test_live_server_refuses_rebinding_cross_site_and_non_json_without_running_the_model(server, read_metrics):
    before = read_metrics()[("specdec:requests_received_total", (("model_name", "demo"),))]
    body = '{"model": "demo", "prompt": "def f(", "max_tokens": 2}'
    r = httpx.post(server + "/v1/completions", content=body, headers={"Host": "rebind.evil.example:8000",
                                                                      "Content-Type": "application/json"})
    assert r.status_code == 400
    r = httpx.post(server + "/v1/completions", content=body, headers={"Origin": "http://evil.example",
                                                                      "Content-Type": "text/plain"})
    assert r.status_code == 403
    r = httpx.post(server + "/v1/completions", content=body, headers={"Content-Type": "text/plain"})
    assert r.status_code == 415
    assert read_metrics()[("specdec:requests_received_total", (("model_name", "demo"),))] == before
    ok = httpx.post(server + "/v1/completions", content=body, headers={"Content-Type": "application/json",
                                                                       "Origin": server})
    assert ok.status_code == 200
