"""Checks every HTTP request passes before a route runs (a pure ASGI middleware): Host, Origin, API key, and a
JSON content type on POST.

- Host (DNS rebinding): a page on a domain the attacker re-points at 127.0.0.1 reaches the server with its own
  name in the Host header. Allowed by default: localhost, 127.0.0.1, ::1 and the address the server is bound to
  (an IP literal cannot be re-pointed); with a wildcard bind (0.0.0.0, ::) any IP literal. Names: --allowed-hosts.
- Origin (cross-site requests from a browser): when the header is present its host must be an allowed host, or
  the origin one of --allowed-origins (those also get CORS headers and preflight answers).
- API key: `Authorization: Bearer KEY` on every route but /health, the playground page, /version, /docs and
  /openapi.json (constant-time comparison).
- Content-Type: a POST must say application/json — a cross-origin form or text/plain POST (which a browser sends
  without a preflight) never reaches the model.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
from dataclasses import dataclass

__all__ = ["GuardConfig", "GuardMiddleware", "LOOPBACK_HOSTS"]

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
_WILDCARDS = ("0.0.0.0", "::", "")
_OPEN_PATHS = ("/health", "/", "/docs", "/openapi.json", "/version")


@dataclass(frozen=True)
class GuardConfig:
    """allowed_hosts: extra Host names (or "*" for any); allowed_origins: extra origins "scheme://host[:port]" (or
    "*"); bind_host: the address the server listens on; api_key: None = no key required."""

    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    bind_host: str = "127.0.0.1"
    api_key: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "allowed_hosts", tuple(h.strip().lower().strip("[]") for h in self.allowed_hosts))
        object.__setattr__(self, "allowed_origins", tuple(o.strip().lower().rstrip("/") for o in self.allowed_origins))
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must not be empty (None = no key)")

    def host_allowed(self, host: str) -> bool:
        if "*" in self.allowed_hosts:
            return True
        name = _strip_port(host).lower()
        if name in LOOPBACK_HOSTS or name in self.allowed_hosts or name == self.bind_host.lower().strip("[]"):
            return True
        if self.bind_host in _WILDCARDS:
            return _is_ip(name)
        return False

    def origin_allowed(self, origin: str) -> tuple[bool, bool]:
        """(allowed, explicitly listed: gets CORS headers)."""
        origin = origin.strip().lower().rstrip("/")
        if "*" in self.allowed_origins or origin in self.allowed_origins:
            return True, True
        scheme, sep, rest = origin.partition("://")
        if not sep or scheme not in ("http", "https") or "/" in rest:
            return False, False  # "null" (sandboxed frames, file://) and anything malformed
        return self.host_allowed(rest), False


def _strip_port(host: str) -> str:
    host = host.strip()
    if host.startswith("["):  # [::1]:8000
        return host[1:].split("]", 1)[0]
    if host.count(":") == 1:
        return host.split(":", 1)[0]
    return host  # a bare IPv6 address, or a name


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class GuardMiddleware:
    def __init__(self, app, config: GuardConfig):
        self.app, self.config = app, config
        self._key_digest = hashlib.sha256(config.api_key.encode()).digest() if config.api_key else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {}
        for name, value in scope.get("headers", ()):
            headers.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
        config = self.config
        host = headers.get("host")
        if host is None or not config.host_allowed(host):
            shown = "(none)" if host is None else repr(host[:100])
            return await _refuse(send, 400, f"Host header {shown} is not allowed: start the server with "
                                 "--allowed-hosts NAME to serve it (protection against DNS rebinding)", "invalid_host")
        origin = headers.get("origin")
        cors = False
        if origin is not None:
            allowed, cors = config.origin_allowed(origin)
            if not allowed:
                return await _refuse(send, 403, f"Origin {origin[:100]!r} is not allowed: start the server with "
                                     "--allowed-origins ORIGIN to let its pages call the API", "invalid_origin")
        method = scope.get("method", "GET")
        if method == "OPTIONS" and origin is not None:
            return await _preflight(send, origin if cors else None)
        path = scope.get("path", "")
        if self._key_digest is not None and path not in _OPEN_PATHS and not self._key_ok(headers.get("authorization")):
            return await _refuse(send, 401, "Incorrect or missing API key: send the header Authorization: Bearer KEY",
                                 "invalid_api_key", type="authentication_error")
        if method in ("POST", "PUT", "PATCH"):
            media = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if media != "application/json":
                shown = repr(headers["content-type"][:80]) if "content-type" in headers else "none"
                return await _refuse(send, 415, f"Content-Type must be application/json, got {shown}",
                                     "unsupported_media_type")
        if not cors:
            return await self.app(scope, receive, send)

        async def send_with_cors(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *_cors_headers(origin)]}
            await send(message)

        return await self.app(scope, receive, send_with_cors)

    def _key_ok(self, authorization: str | None) -> bool:
        if not authorization:
            return False
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer":
            return False
        # equal-length digests: the comparison's time tells nothing about the key or its length
        return hmac.compare_digest(hashlib.sha256(token.strip().encode()).digest(), self._key_digest)


def _cors_headers(origin: str) -> list[tuple[bytes, bytes]]:
    return [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")]


async def _preflight(send, origin: str | None) -> None:
    headers = [(b"content-length", b"0")]
    if origin is not None:
        headers += [*_cors_headers(origin), (b"access-control-allow-methods", b"GET, POST, OPTIONS"),
                    (b"access-control-allow-headers", b"authorization, content-type"),
                    (b"access-control-max-age", b"600")]
    await send({"type": "http.response.start", "status": 204, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


async def _refuse(send, status: int, message: str, code: str, type: str = "invalid_request_error") -> None:
    body = json.dumps({"error": {"message": message, "type": type, "param": None, "code": code}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
