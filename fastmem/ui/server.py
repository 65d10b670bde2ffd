"""Run the inspector: uvicorn on loopback, the address with its token printed (and opened
in a browser where there is one)."""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import webbrowser
from typing import Any, TextIO

from .app import create_app
from .security import Secrets

__all__ = ["serve"]

DEFAULT_PORT = 8765


def serve(
    path: str,
    *,
    namespace: str | None = None,
    port: int | None = None,
    host: str = "127.0.0.1",
    readonly: bool = False,
    browser: bool = True,
    out: TextIO | None = None,
    embedder: Any = "default",
) -> int:
    """Serve the inspector for the store at ``path`` until interrupted; returns 0.

    Args:
        path, namespace, readonly, embedder: as :func:`fastmem.ui.app.create_app`.
        port: the port (default 8765, or a free one when 8765 is taken; 0: a free one).
        host: the address to bind; loopback by default. Another address exposes the
            store (still behind the token) to whoever can reach it.
        browser: open the address in a browser when one is available.
        out: where the address is printed (stdout by default).

    Raises:
        StoreNotFoundError: there is no store at ``path``.
        OSError: the port cannot be bound.
    """
    import uvicorn

    out = out or sys.stdout
    sock = _bind(host, DEFAULT_PORT if port is None else port, fallback=port is None)
    bound = sock.getsockname()[1]
    secrets = Secrets()
    app = create_app(
        path,
        namespace=namespace,
        readonly=readonly,
        port=bound,
        host=host,
        secrets=secrets,
        embedder=embedder,
        freeze_heap=True,  # this process is the inspector's own
    )
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{bound}/?token={secrets.token}"
    out.write(
        f"fastmem inspector for {app.state.inspector.label}"
        f"{' (read-only)' if readonly else ''}\n  {url}\nCtrl-C to stop.\n"
    )
    out.flush()
    config = uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False)
    server = uvicorn.Server(config)
    if browser:
        threading.Timer(0.5, _open, (url,)).start()
    server.run(sockets=[sock])
    return 0


def _bind(host: str, port: int, fallback: bool) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        if not fallback:
            sock.close()
            raise
        sock.bind((host, 0))  # the default port is taken (another inspector): any free one
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def _open(url: str) -> None:
    with contextlib.suppress(
        webbrowser.Error, OSError
    ):  # no browser: the printed address is enough
        webbrowser.open(url)
