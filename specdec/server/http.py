"""The HTTP connection layer under the app: uvicorn's h11 protocol plus what uvicorn does not do.

uvicorn closes a connection idle *between* requests (`timeout_keep_alive`) and caps header size (h11's
incomplete-event limit), but a connection that sends nothing, or half a request line, or half a body, is
kept forever, and `limit_concurrency` only answers 503 once a request arrives — idle sockets still pile up
until file descriptors run out. `GuardedH11Protocol` adds:

- a read deadline: a request's headers and body must arrive within `read_timeout` seconds of its first
  byte (or of the connection opening); otherwise 408 (headers incomplete) or the connection is closed (body
  incomplete: the app sees a disconnect). The deadline is not extended by trickled bytes (slowloris).
- a connection limit: past `max_connections` open connections a new one gets 503 and is closed at once.
- a header limit that holds whatever the reads' sizes: past MAX_HEADER_BYTES before the blank line, 431.
"""

from __future__ import annotations

import json
import logging
import socket

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["guarded_protocol", "server_config", "bind_socket", "MAX_HEADER_BYTES"]

logger = logging.getLogger(__name__)

MAX_HEADER_BYTES = 16 * 1024


def _response(status: int, reason: str, message: str) -> bytes:
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                 "code": None}}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n").encode()
    return head + body


class GuardedH11Protocol(H11Protocol):
    read_timeout: float = 30.0
    max_connections: int = 512

    def connection_made(self, transport) -> None:  # noqa: D102 - asyncio.Protocol
        self._read_deadline = None
        self._head = b""
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            logger.warning("refused a connection: %d open connections (--max-connections %d)", len(self.connections) - 1,
                           self.max_connections)
            transport.write(_response(503, "Service Unavailable",
                                      f"too many open connections (at most {self.max_connections})"))
            transport.close()
            return
        self._arm()

    def data_received(self, data: bytes) -> None:  # noqa: D102
        if self.conn.their_state is h11.IDLE and not self._head_fits(data):
            logger.info("refused a request whose headers exceed %d bytes", MAX_HEADER_BYTES)
            self.transport.write(_response(431, "Request Header Fields Too Large",
                                           f"the request line and headers exceed {MAX_HEADER_BYTES} bytes"))
            self.transport.close()
            return
        super().data_received(data)
        if self.transport.is_closing():
            return
        if self.conn.their_state in (h11.IDLE, h11.SEND_BODY):
            if self._read_deadline is None:
                self._arm()
        else:  # the whole request is in: the app runs as long as it needs
            self._disarm()

    def _head_fits(self, data: bytes) -> bool:
        """Whether the request line and headers arriving (across reads) end within MAX_HEADER_BYTES. h11's own limit
        only bounds what it buffers between reads: headers arriving in one read would pass whatever their size."""
        head = (self._head + data)[: MAX_HEADER_BYTES + 4]
        if head.find(b"\r\n\r\n") >= 0:
            self._head = b""
            return True
        self._head = head
        return len(head) <= MAX_HEADER_BYTES

    def connection_lost(self, exc) -> None:  # noqa: D102
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._read_deadline = self.loop.call_later(self.read_timeout, self._read_timed_out)

    def _disarm(self) -> None:
        if self._read_deadline is not None:
            self._read_deadline.cancel()
            self._read_deadline = None

    def _read_timed_out(self) -> None:
        self._read_deadline = None
        if self.transport.is_closing():
            return
        if self.conn.their_state is h11.IDLE and self.conn.our_state is h11.IDLE:
            self.transport.write(_response(408, "Request Timeout",
                                           f"the request was not received within {self.read_timeout:g} s"))
        logger.info("closed a connection whose request did not arrive within %g s", self.read_timeout)
        self.transport.close()


def guarded_protocol(read_timeout: float, max_connections: int) -> type:
    """A `GuardedH11Protocol` subclass with these limits (uvicorn instantiates the class it is given)."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,),
                {"read_timeout": float(read_timeout), "max_connections": int(max_connections)})


def bind_socket(host: str, port: int) -> socket.socket:
    """The listening socket, bound now (before a model loads): OSError when the port is taken or not allowed."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def server_config(app, *, host: str, port: int, read_timeout: float = 30.0, keep_alive: float = 5.0,
                  max_connections: int = 512, log_level: str = "warning"):
    """uvicorn's Config with the guarded protocol, the keep-alive timeout and the header size limit."""
    import uvicorn

    return uvicorn.Config(app, host=host, port=port, http=guarded_protocol(read_timeout, max_connections),
                          timeout_keep_alive=keep_alive, h11_max_incomplete_event_size=MAX_HEADER_BYTES,
                          log_level=log_level, lifespan="off")
