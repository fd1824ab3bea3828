"""The connection layer under attack (`specdec.server.http`, uvicorn + GuardedH11Protocol, no model): idle, half-sent
and trickled requests are closed at the read deadline; past the connection limit a connection gets 503 at once;
a slow *response* is never cut; a client that leaves mid-body is seen by the app as a disconnect."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

pytest.importorskip("uvicorn")

from specdec.server.http import bind_socket, server_config  # noqa: E402

READ_TIMEOUT = 0.5
KEEP_ALIVE = 0.5
MAX_CONNECTIONS = 4


class App:
    """Echoes the body's length; `/slow` answers after 1.5 s; records disconnects seen while reading a body."""

    def __init__(self):
        self.disconnects = 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.disconnects += 1
                return
            size += len(message.get("body", b""))
            if not message.get("more_body"):
                break
        if scope["path"] == "/slow":
            await asyncio.sleep(1.5)
        body = str(size).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def live():
    import uvicorn

    app = App()
    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    config = server_config(app, host="127.0.0.1", port=port, read_timeout=READ_TIMEOUT, keep_alive=KEEP_ALIVE,
                           max_connections=MAX_CONNECTIONS)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 10
    while not server.started and time.time() < deadline:
        time.sleep(0.02)
    yield app, port
    server.should_exit = True
    thread.join(timeout=5)
    sock.close()


def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    return s


def read_until_closed(s: socket.socket, limit: float = 5.0) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and how long that took."""
    start, data = time.perf_counter(), b""
    s.settimeout(limit)
    while True:
        try:
            chunk = s.recv(65536)
        except (ConnectionResetError, socket.timeout):
            break
        if not chunk:
            break
        data += chunk
    return data, time.perf_counter() - start


def request(port: int, path: str = "/", body: bytes = b"x") -> bytes:
    with connect(port) as s:
        s.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: "
                  + str(len(body)).encode() + b"\r\n\r\n" + body)
        return read_until_closed(s)[0]


def test_a_complete_request_is_served_and_a_slow_response_is_not_cut(live):
    _, port = live
    assert request(port, body=b"hello").endswith(b"5")
    assert b"200 OK" in request(port, "/slow")  # 1.5 s > the read deadline: the deadline covers reading only


@pytest.mark.parametrize("sent", [b"", b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\n"], ids=["idle", "half headers"])
def test_an_idle_or_half_sent_request_gets_408_and_is_closed(live, sent):
    _, port = live
    with connect(port) as s:
        s.sendall(sent)
        data, took = read_until_closed(s)
    assert data.startswith(b"HTTP/1.1 408") and took < READ_TIMEOUT + 2


def test_trickled_headers_do_not_extend_the_deadline(live):
    _, port = live
    line = b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 100
    with connect(port) as s:
        start = time.perf_counter()
        closed = False
        for byte in line:
            try:
                s.sendall(bytes([byte]))
            except OSError:
                closed = True
                break
            time.sleep(0.05)
            if time.perf_counter() - start > READ_TIMEOUT + 2:
                break
        data, _ = read_until_closed(s, limit=2)
        took = time.perf_counter() - start
    assert closed or data.startswith(b"HTTP/1.1 408")
    assert took < READ_TIMEOUT + 2.5


def test_a_half_sent_body_is_closed_and_the_app_sees_a_disconnect(live):
    app, port = live
    before = app.disconnects
    with connect(port) as s:
        s.sendall(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n" + b"x" * 10)
        data, took = read_until_closed(s)
    assert data == b"" and took < READ_TIMEOUT + 2
    deadline = time.time() + 2
    while app.disconnects == before and time.time() < deadline:
        time.sleep(0.02)
    assert app.disconnects == before + 1


def test_past_the_connection_limit_a_connection_gets_503_at_once(live):
    _, port = live
    idle = [connect(port) for _ in range(MAX_CONNECTIONS)]
    try:
        time.sleep(0.1)
        with connect(port) as extra:
            extra.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            data, took = read_until_closed(extra)
        assert data.startswith(b"HTTP/1.1 503") and took < READ_TIMEOUT
    finally:
        for s in idle:
            s.close()
    time.sleep(0.2)
    assert request(port, body=b"ok").endswith(b"2")  # the slots are free again


def test_idle_sockets_are_reclaimed_so_new_clients_get_in(live):
    _, port = live
    idle = [connect(port) for _ in range(MAX_CONNECTIONS)]  # never send anything, never close
    try:
        time.sleep(READ_TIMEOUT + 0.5)  # the read deadline closes them
        assert request(port, body=b"abc").endswith(b"3")
    finally:
        for s in idle:
            s.close()


def test_an_idle_keep_alive_connection_is_closed(live):
    _, port = live
    with connect(port) as s:
        s.sendall(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1\r\n\r\nx")
        data, took = read_until_closed(s)
    assert b"200 OK" in data and took < KEEP_ALIVE + 2


def test_oversized_headers_are_refused(live):
    _, port = live
    with connect(port) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * (64 * 1024) + b"\r\n\r\n")
        data, _ = read_until_closed(s)
    assert data.startswith(b"HTTP/1.1 431")
    with connect(port) as s:  # the same, trickled over many reads
        s.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
        try:
            for _ in range(40):
                s.sendall(b"a" * 1024)
        except OSError:
            pass
        data, _ = read_until_closed(s)
    assert data.startswith(b"HTTP/1.1 431") or data.startswith(b"HTTP/1.1 400")
