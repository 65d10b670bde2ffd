"""The inspector's guard: who may talk to it, and from which page.

A local web tool is still an attack surface: any web page the user opens can send requests
to ``127.0.0.1``, and a DNS-rebinding page can make its own name resolve there. So:

* **A token per run**, random, in the address ``fastmem ui`` prints (as Jupyter does). The
  first request that carries it (``?token=``) gets it as a cookie (HttpOnly,
  SameSite=Strict, named after the port: cookies are shared by every port of a host) and
  is redirected to the same address without it, so it does not linger in the history. A
  request without a valid cookie, ``X-Fastmem-Token`` header or ``Authorization: Bearer``
  is refused (403).
* **Host checked**: only the names the server was bound to (``127.0.0.1:PORT``,
  ``localhost:PORT``, ``[::1]:PORT``); a rebinding attacker's name is refused (421).
* **Origin checked**: a request that says it comes from another origin is refused, and so
  is one a browser marks ``Sec-Fetch-Site: cross-site``.
* **CSRF**: every write carries the run's second token (a hidden form field the pages
  hold; see :func:`check_csrf`), which another site cannot read.
* **Headers**: a Content-Security-Policy allowing only the inspector's own scripts and
  styles (no inline script, so escaped memory text can never run), no framing, no
  referrer, no caching.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable
from http.cookies import CookieError, SimpleCookie
from typing import Any
from urllib.parse import parse_qsl, urlencode

__all__ = ["Guard", "Secrets", "check_csrf", "loopback_hosts"]

Scope = dict[str, Any]
ASGIApp = Callable[
    [Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]
]

SECURITY_HEADERS = [
    (
        b"content-security-policy",
        (
            b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
            b"connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
        ),
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),  # no-referrer would make the forms' Origin "null"
    (b"cache-control", b"no-store"),
    (b"cross-origin-resource-policy", b"same-origin"),
]


class Secrets:
    """The run's two random tokens: ``token`` opens the inspector, ``csrf`` signs writes."""

    def __init__(self, token: str | None = None, csrf: str | None = None) -> None:
        self.token = token or secrets.token_urlsafe(24)
        self.csrf = csrf or secrets.token_urlsafe(24)

    def is_token(self, value: str | None) -> bool:
        """Whether ``value`` is the run's token (compared in constant time)."""
        return bool(value) and hmac.compare_digest(str(value).encode(), self.token.encode())

    def is_csrf(self, value: str | None) -> bool:
        """Whether ``value`` is the run's CSRF token (compared in constant time)."""
        return bool(value) and hmac.compare_digest(str(value).encode(), self.csrf.encode())


def loopback_hosts(port: int, host: str = "127.0.0.1") -> set[str]:
    """The ``Host`` headers a server bound to ``host``:``port`` answers: the loopback names
    (and ``host`` itself when it was bound elsewhere on purpose)."""
    names = {"127.0.0.1", "localhost", "[::1]", host if ":" not in host else f"[{host}]"}
    return {f"{name}:{port}" for name in names} | ({*names} if port == 80 else set())


def check_csrf(secrets_: Secrets, form: dict[str, str], headers: Any) -> bool:
    """Whether a write carries the run's CSRF token (form field ``csrf`` or header
    ``X-CSRF-Token``)."""
    return secrets_.is_csrf(form.get("csrf")) or secrets_.is_csrf(headers.get("x-csrf-token"))


class Guard:
    """ASGI middleware that refuses every request failing the checks of this module and
    adds the security headers to every response.

    Args:
        app: the application it guards.
        secrets_: the run's tokens.
        hosts: the ``Host`` header values allowed (:func:`loopback_hosts`).
        cookie: the cookie's name (one per port).
    """

    def __init__(self, app: ASGIApp, secrets_: Secrets, hosts: Iterable[str], cookie: str) -> None:
        self.app, self.secrets, self.cookie = app, secrets_, cookie
        self.hosts = {h.lower() for h in hosts}
        self.origins = {f"http://{h}" for h in self.hosts}

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":  # lifespan: nothing to guard
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            await _plain(send, *refusal)
            return
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        given = [v for k, v in query if k == "token"]
        if any(self.secrets.is_token(v) for v in given) and scope["method"] in ("GET", "HEAD"):
            # The printed address: keep the token as a cookie, then show the page without it.
            rest = urlencode([(k, v) for k, v in query if k != "token"])
            where = scope.get("path", "/") + (f"?{rest}" if rest else "")
            cookie = f"{self.cookie}={self.secrets.token}; HttpOnly; SameSite=Strict; Path=/"
            await _plain(
                send,
                303,
                "see other",
                [(b"location", where.encode()), (b"set-cookie", cookie.encode())],
            )
            return

        started = time.perf_counter()

        async def secured(message: Any) -> None:
            if message["type"] == "http.response.start":
                # The server's whole time for the request until its response starts
                # (devtools show it; benchmarks/ui_speed.py reads it).
                took = f"total;dur={1000 * (time.perf_counter() - started):.3f}".encode()
                headers = [*message.get("headers", []), *SECURITY_HEADERS, (b"server-timing", took)]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, secured)

    def _refusal(self, scope: Scope, headers: dict[str, str]) -> tuple[int, str] | None:
        """(status, reason) when the request must be refused; ``None`` when it may pass."""
        if headers.get("host", "").lower() not in self.hosts:
            return 421, "unknown Host: the inspector answers only on the address it printed"
        origin = headers.get("origin")
        if origin is not None and origin.lower() not in self.origins:
            return 403, "cross-origin request refused"
        if headers.get("sec-fetch-site") == "cross-site":
            return 403, "cross-site request refused"
        if self._authorized(scope, headers):
            return None
        return 403, (
            "this inspector needs its token: open the address `fastmem ui` printed "
            "(it ends with ?token=...)"
        )

    def _authorized(self, scope: Scope, headers: dict[str, str]) -> bool:
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        if any(k == "token" and self.secrets.is_token(v) for k, v in query):
            return True
        if self.secrets.is_token(headers.get("x-fastmem-token")):
            return True
        auth = headers.get("authorization", "")
        if auth.lower().startswith("bearer ") and self.secrets.is_token(auth[7:].strip()):
            return True
        jar: SimpleCookie = SimpleCookie()
        try:
            jar.load(headers.get("cookie", ""))
        except CookieError:  # a malformed Cookie header: no cookie
            return False
        morsel = jar.get(self.cookie)
        return morsel is not None and self.secrets.is_token(morsel.value)


async def _plain(
    send: Any, status: int, text: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = (text + "\n").encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
                *SECURITY_HEADERS,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
