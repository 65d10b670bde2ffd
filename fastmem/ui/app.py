"""The inspector's web application: routes over one store, server-rendered with Jinja2.

Reads go through a read-only handle (so building a context in the inspector does not count
as an access and changes no importance); changes go through a second, read-write handle
opened on the first change (none with ``readonly``), each an ordinary fastmem write that
takes the writer lock for its append, safe beside running agents. Store calls run in
Starlette's thread pool, never on the event loop.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import threading
import time
from calendar import timegm
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import parse_qsl, urlencode

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

import fastmem
from fastmem.errors import (
    FastmemError,
    InvalidInputError,
    InvalidTypeError,
    ReadOnlyError,
    StoreLockedError,
    StoreNotFoundError,
    UnknownMemoryError,
)
from fastmem.export import from_jsonable

from . import views
from .security import Guard, Secrets, check_csrf, loopback_hosts

__all__ = ["Inspector", "create_app"]

HERE = os.path.dirname(os.path.abspath(__file__))
PAGE = 50  # timeline rows per page
TYPES_EVERY = 10.0  # seconds between two readings of the type names while the store changes
MAX_FORM_BYTES = 4 << 20  # a memory's text is at most 1 MiB of UTF-8; urlencoded, up to 3x
MODES = ("hybrid", "vector", "keyword")
# The changes: what each does, for the confirmation page and the message after it.
ACTIONS = {
    "pin": "Pin",
    "unpin": "Unpin",
    "forget": "Forget",
    "importance": "Set the importance of",
    "metadata": "Replace the metadata of",
    "supersede": "Supersede",
    "add": "Add a memory",
}
DONE = {
    "pin": "Pinned.",
    "unpin": "Unpinned.",
    "forget": "Forgotten.",
    "importance": "Importance changed.",
    "metadata": "Metadata changed.",
    "supersede": "Superseded: this is the new version.",
    "add": "Added.",
}
_STATUS = (
    (UnknownMemoryError, 404),
    (StoreNotFoundError, 404),
    (InvalidInputError, 400),
    (InvalidTypeError, 400),
    (ReadOnlyError, 403),
    (StoreLockedError, 409),
)


class Inspector:
    """The store handles and settings one inspector serves.

    Args:
        path: the store (``PATH.dat`` + ``PATH.idx``), or with ``namespace`` the root
            directory of namespaced stores.
        namespace: the store of one user or profile under ``path``.
        readonly: no changes (no read-write handle is ever opened).
        embedder: the embedder for queries and new memories (``fastmem.open``'s default
            when left out; ``None`` for keyword search only).
    """

    def __init__(
        self,
        path: str,
        *,
        namespace: str | None = None,
        readonly: bool = False,
        embedder: Any = "default",
    ) -> None:
        self.path, self.namespace, self.readonly = str(path), namespace, readonly
        if embedder == "default":  # fastmem.open's default, made here to wait for it (ready())
            embedder = None if os.environ.get("FASTMEM_EMBEDDER") == "none" else _default()
        options: dict[str, Any] = {"embedder": embedder}
        try:
            self.reader = fastmem.open(path, namespace=namespace, readonly=True, **options)
        except fastmem.EmbedderMismatchError:  # written by a model not at hand: keywords only
            options = {"embedder": None}
            self.reader = fastmem.open(path, namespace=namespace, readonly=True, **options)
        self._options = options
        self._writer: fastmem.MemoryStore | None = None
        self._lock = threading.Lock()
        self._ready = False
        self.settled = threading.Event()  # set once warm with the heap frozen (freeze_heap)
        self._types: tuple[Any, float, list[str]] | None = None
        self.embedder = _embedder_name(options["embedder"])

    @property
    def label(self) -> str:
        """The store as the pages name it: its path, and its namespace if any."""
        return self.path + (f" · namespace {self.namespace}" if self.namespace else "")

    def types(self) -> list[str]:
        """The store's type names, most memories first, for the search form: ``types()``
        (tens of milliseconds at a million memories) again only when the store changed, and
        then at most every ``TYPES_EVERY`` seconds (a new type shows in the list that late)."""
        newest = self.reader.recent(1)
        key = (len(self.reader), newest[0].id if newest else None)
        now = time.monotonic()
        cached = self._types
        if cached is None or (cached[0] != key and now - cached[1] >= TYPES_EVERY):
            counts = self.reader.types()
            self._types = cached = (key, now, sorted(counts, key=lambda n: (-counts[n], n)))
        return cached[2]

    def ready(self) -> None:
        """Wait for the embedding model (as the command line does): the inspector shows a
        context and a search at full quality, not the degraded ones of a loading model."""
        if self._ready:
            return
        wait = getattr(self._options["embedder"], "wait", None)
        if wait is not None and len(self.reader):
            wait()
            self._ready = True  # loaded: later calls need not ask (an empty store asks again)
        elif wait is None:
            self._ready = True

    def warm(self) -> None:
        """Run a search and a context once (at start, in the background): the first page a
        user opens then shows the time of a warm store, not of the first query's loading."""
        try:
            # A non-ASCII text loads the exact counter (tiktoken, ~0.3 s once); headers
            # hold "·", so the first context would otherwise pay for it.
            self.reader.tokens.count("warm · up")
            self.ready()
            if len(self.reader):
                self.reader.search("warm up", 1)
                self.reader.context("warm up", 64)
        except FastmemError:  # closed meanwhile, or a damaged store: the pages will say
            pass

    def writer(self) -> fastmem.MemoryStore:
        """The read-write handle, opened on the first change.

        Raises:
            ReadOnlyError: the inspector runs with ``readonly``.
        """
        if self.readonly:
            raise ReadOnlyError("the inspector was started with --readonly: no changes")
        with self._lock:
            if self._writer is None:
                self._writer = fastmem.open(self.path, namespace=self.namespace, **self._options)
            return self._writer

    def close(self) -> None:
        """Close both handles (the server's shutdown does)."""
        with self._lock:
            for store in (self._writer, self.reader):
                if store is not None:
                    store.close()


def _default() -> Any:
    from fastmem.embed import default_embedder

    try:
        return default_embedder()
    except fastmem.EmbedderUnavailableError:  # not installed: keyword search only
        return None


def _embedder_name(embedder: Any) -> str:
    if embedder is None:
        return "none (keyword search only)"
    name, dim = getattr(embedder, "name", type(embedder).__name__), getattr(embedder, "dim", "?")
    return f"{name} ({dim} dims)"


def create_app(
    path: str,
    *,
    namespace: str | None = None,
    readonly: bool = False,
    port: int = 8765,
    host: str = "127.0.0.1",
    secrets: Secrets | None = None,
    hosts: set[str] | None = None,
    embedder: Any = "default",
    freeze_heap: bool = False,
) -> Any:
    """The inspector's ASGI application for the store at ``path``, behind its guard
    (:mod:`fastmem.ui.security`).

    Args:
        path, namespace, readonly, embedder: as :class:`Inspector`.
        port, host: where it is served (the ``Host`` headers allowed, the cookie's name).
        secrets: the run's tokens (random by default); ``app.state.secrets`` holds them.
        hosts: the ``Host`` headers allowed, instead of the loopback names of ``port``.
        freeze_heap: once warm, move the process's objects out of the cyclic garbage
            collector's reach (``gc.freeze()``): the store's index and caches live as long
            as the process, and a full collection over them took about 150 ms at a million
            memories, a pause in whichever request it fell on. ``fastmem ui`` (a process of
            its own) sets it; an application that embeds the inspector decides for itself.

    Raises:
        StoreNotFoundError: there is no store at ``path``.
    """
    inspector = Inspector(path, namespace=namespace, readonly=readonly, embedder=embedder)
    secrets = secrets or Secrets()
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(os.path.join(HERE, "templates")), autoescape=True
    )
    env.globals.update(
        LEVELS=views.LEVELS,
        when=views.when,
        preview=views.preview,
        visible=views.visible,
        csrf=secrets.csrf,
        inspector=inspector,
        ACTIONS=ACTIONS,
        version=fastmem.__version__,
        nav="",
    )
    env.filters["visible"] = views.visible
    env.filters["thousands"] = lambda n: f"{n:,}"
    env.filters["bytes"] = _human_bytes

    def render(name: str, **values: Any) -> str:
        return env.get_template(name).render(**values)

    def page(name: str, status: int = 200, **values: Any) -> HTMLResponse:
        return HTMLResponse(render(name, **values), status_code=status)

    async def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await run_in_threadpool(fn, *args, **kwargs)

    reader = inspector.reader

    async def overview(request: Request) -> Response:
        data = await call(views.overview, reader)
        return page("overview.html", nav="overview", **data)

    async def figures(request: Request) -> Response:
        data = await call(views.figures, reader, inspector.embedder)
        return page("_figures.html", **data)

    async def verify(request: Request) -> Response:
        started = time.perf_counter()
        report = await call(reader.verify)
        return page("_verify.html", report=report, seconds=time.perf_counter() - started)

    async def timeline(request: Request) -> Response:
        before = request.query_params.get("before") or None
        session = request.query_params.get("session") or None
        memories = await call(reader.recent, PAGE + 1, before=before, session=session)
        previous = await call(_maybe_get, reader, before)
        more = len(memories) > PAGE
        memories = memories[:PAGE]
        rows = views.group_timeline(memories, previous)
        here = {"session": session} if session else {}
        values: dict[str, Any] = {
            "rows": rows,
            "next": memories[-1].id if more else None,
            "more_url": "/timeline?" + urlencode({"partial": 1, **here, "before": memories[-1].id})
            if more
            else None,
            "refresh_url": "/timeline?" + urlencode({"partial": 1, **here}),
            "before": before,
            "session": session,
            "done": DONE.get(request.query_params.get("done", "")),
        }
        if request.query_params.get("partial"):
            return page("_rows.html", **values)
        return page("timeline.html", nav="timeline", **values)

    async def memory(request: Request) -> Response:
        mid = request.path_params["mid"]
        data = await call(views.memory_detail, reader, mid)
        done = DONE.get(request.query_params.get("done", ""))
        partial = request.query_params.get("partial")
        if partial:  # "page": the section as the memory's own page shows it (live refresh)
            return page("_memory.html", partial=partial != "page", done=None, **data)
        return page("memory.html", nav="timeline", partial=False, done=done, **data)

    async def search(request: Request) -> Response:
        qp = request.query_params
        q = qp.get("q", "")
        mode = qp.get("mode", "hybrid")
        form = {
            "q": q,
            "mode": mode if mode in MODES else "hybrid",
            "k": qp.get("k", "20"),
            "type": qp.get("type", ""),
            "session": qp.get("session", ""),
            "since": qp.get("since", ""),
            "until": qp.get("until", ""),
        }

        def build() -> tuple[str, dict[str, Any] | None]:
            # One trip to the thread pool for the store's calls and the rendering (each trip
            # is two hand-offs between threads, and the rendering stays off the event loop).
            result = None
            if q.strip():
                inspector.ready()
                result = views.search_view(
                    reader,
                    q,
                    mode=form["mode"],
                    k=_int(form["k"], "k", 1, 200),
                    types=[form["type"]] if form["type"] else None,
                    session=form["session"] or None,
                    since=_date(form["since"], "since"),
                    until=_date(form["until"], "until", end=True),
                )
            types = inspector.types()
            body = render("search.html", nav="search", form=form, result=result, types=types)
            return body, result

        body, result = await call(build)
        response = HTMLResponse(body)
        if result is not None:  # the store's part of the request, for devtools and benchmarks
            response.headers["server-timing"] = f"search;dur={result['ms']:.3f}"
        return response

    async def context(request: Request) -> Response:
        qp = request.query_params
        form = {
            "q": qp.get("q", ""),
            "budget": qp.get("budget", "1300"),
            "session": qp.get("session", ""),
        }

        as_json = qp.get("format") == "json"

        def build() -> tuple[Any, views.ContextView | None]:
            # One trip to the thread pool for the store's call and the rendering (as search).
            started = time.perf_counter()
            view = None
            if "q" in qp:
                inspector.ready()
                view = views.context_view(
                    reader,
                    form["q"],
                    _int(form["budget"], "budget", 1, 1_000_000),
                    form["session"] or None,
                )
            if as_json and view is not None:
                return views.context_json(view), view
            body = render(
                "context.html",
                nav="context",
                form=form,
                view=view,
                policy=reader.policy,
                preload=reader.preload_progress,
            )
            spent[0] = 1000 * (time.perf_counter() - started)
            return body, view

        spent = [0.0]  # ms in the thread: the view and its rendering
        body, view = await call(build)
        if as_json and view is not None:
            return JSONResponse(body)
        response = HTMLResponse(body)
        if view is not None:  # context()'s own time, and the call's as the page saw it
            response.headers["server-timing"] = (
                f"context;dur={1000 * view.ctx.seconds:.3f}, call;dur={view.ms:.3f}, "
                f"thread;dur={spent[0]:.3f}"
            )
        return response

    async def add_form(request: Request) -> Response:
        if inspector.readonly:
            raise ReadOnlyError("the inspector was started with --readonly: no changes")
        return page("add.html", nav="add")

    async def change(request: Request) -> Response:
        if inspector.readonly:
            raise ReadOnlyError("the inspector was started with --readonly: no changes")
        body = await _body(request)
        # A browser sends a textarea's line breaks as CRLF: a memory gets them as typed.
        form = {
            k: v.replace("\r\n", "\n")
            for k, v in parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)
        }
        if not check_csrf(secrets, form, request.headers):
            return page(
                "error.html",
                403,
                title="Refused",
                message="This change lacks the page's CSRF token: reload the page and try again.",
            )
        action = form.get("action", "")
        if action not in ACTIONS:
            raise InvalidInputError(f"unknown change {action!r}")
        mid = form.get("id", "")
        target = None if action == "add" else await call(reader.get, mid)
        if form.get("confirm") != "1":
            _parse_change(action, form)  # a bad value is refused before the confirmation
            hidden = [(k, v) for k, v in form.items() if k not in ("csrf", "confirm")]
            return page(
                "confirm.html", nav="", action=action, target=target, form=form, hidden=hidden
            )
        done = await call(_apply, inspector.writer(), action, mid, form)
        where = "/timeline" if action == "forget" else f"/memory/{done}"
        return RedirectResponse(f"{where}?{urlencode({'done': action})}", status_code=303)

    async def older(request: Request) -> Response:
        await call(inspector.ready)
        versions = await call(views.older_versions, reader, request.path_params["mid"])
        return page("_older.html", older=versions)

    async def pulse(request: Request) -> Response:
        return JSONResponse(await call(views.pulse, reader, reader.dat_path))

    async def failed(request: Request, exc: Exception) -> Response:
        status = next((code for kind, code in _STATUS if isinstance(exc, kind)), 500)
        message = " ".join(str(exc).split())
        if request.url.path.startswith("/api/") or request.query_params.get("format") == "json":
            return JSONResponse(
                {"error": type(exc).__name__, "message": message}, status_code=status
            )
        return page("error.html", status, title=type(exc).__name__, message=message)

    routes = [
        Route("/", overview),
        Route("/overview/figures", figures),
        Route("/verify", verify),
        Route("/timeline", timeline),
        Route("/memory/{mid}", memory),
        Route("/memory/{mid}/older", older),
        Route("/search", search),
        Route("/context", context),
        Route("/add", add_form),
        Route("/change", change, methods=["POST"]),
        Route("/api/pulse", pulse),
        Mount("/static", app=StaticFiles(directory=os.path.join(HERE, "static")), name="static"),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        closing = threading.Event()

        def settle() -> None:
            inspector.warm()
            if not freeze_heap:
                return
            # The level-2 preload fills the store's caches in the background: frozen after
            # it, they stay out of the collector's way too (a close stops the wait).
            while not closing.is_set() and not inspector.reader.wait_preload(1.0):
                pass
            if not closing.is_set():
                gc.collect()
                gc.freeze()
                inspector.settled.set()

        warming = threading.Thread(target=settle, name="fastmem-ui-warm", daemon=True)
        warming.start()
        yield
        closing.set()
        warming.join(timeout=5)
        inspector.close()

    app = Starlette(routes=routes, exception_handlers={FastmemError: failed}, lifespan=lifespan)
    app.state.inspector, app.state.secrets = inspector, secrets
    allowed = hosts if hosts is not None else loopback_hosts(port, host)
    guarded = Guard(app, secrets, allowed, cookie=f"fastmem_ui_{port}")
    guarded.state = app.state  # type: ignore[attr-defined]
    return guarded


# --- changes ---------------------------------------------------------------------------


def _parse_change(action: str, form: dict[str, str]) -> dict[str, Any]:
    """The values a change writes, checked (a bad one raises before anything is written).

    Raises:
        InvalidInputError: a value is missing or malformed.
    """
    if action == "importance":
        return {"importance": _float(form.get("value", ""), "importance", 0.0, 1.0)}
    if action == "metadata":
        try:
            value = json.loads(form.get("value", "") or "{}")
        except ValueError as exc:
            raise InvalidInputError(f"metadata must be a JSON object: {exc}") from None
        if not isinstance(value, dict):
            raise InvalidInputError("metadata must be a JSON object ({...})")
        return {"metadata": from_jsonable(value)}
    if action in ("supersede", "add"):
        text = form.get("text", "")
        if not text.strip():
            raise InvalidInputError("the new memory's text is empty")
        out: dict[str, Any] = {"text": text}
        if action == "add":
            if form.get("metadata", "").strip():
                out["metadata"] = _parse_change("metadata", {"value": form["metadata"]})["metadata"]
            if form.get("importance", "").strip():
                out["importance"] = _float(form["importance"], "importance", 0.0, 1.0)
            out.update(
                type=form.get("type") or "conversation",
                session=form.get("session") or None,
                summary=form.get("summary") or None,
                pinned=form.get("pinned") == "1",
            )
        return out
    return {}


def _apply(writer: fastmem.MemoryStore, action: str, mid: str, form: dict[str, str]) -> str:
    """Make the change with ordinary fastmem calls; returns the id to show after it."""
    values = _parse_change(action, form)
    if action in ("pin", "unpin"):
        writer.pin(mid, action == "pin")
    elif action == "forget":
        writer.forget(mid)
    elif action in ("importance", "metadata"):
        writer.update(mid, **values)
    elif action == "supersede":
        old = writer.get(mid)
        return writer.add(values["text"], type=old.type, session=old.session, supersedes=mid)
    elif action == "add":
        return writer.add(values.pop("text"), **values)
    return mid


# --- parameters ------------------------------------------------------------------------


def _maybe_get(store: fastmem.MemoryStore, mid: str | None) -> fastmem.Memory | None:
    if mid is None:
        return None
    try:
        return store.get(mid)
    except (UnknownMemoryError, InvalidTypeError):
        return None


def _int(value: str, name: str, lo: int, hi: int) -> int:
    try:
        n = int(value)
    except ValueError:
        raise InvalidInputError(f"{name} must be a whole number, got {value[:40]!r}") from None
    if not lo <= n <= hi:
        raise InvalidInputError(f"{name} must be from {lo:,} to {hi:,}, got {n:,}")
    return n


def _float(value: str, name: str, lo: float, hi: float) -> float:
    try:
        x = float(value)
    except ValueError:
        raise InvalidInputError(f"{name} must be a number, got {value[:40]!r}") from None
    if not (math.isfinite(x) and lo <= x <= hi):
        raise InvalidInputError(f"{name} must be from {lo:g} to {hi:g}, got {value[:40]!r}")
    return x


def _date(value: str, name: str, end: bool = False) -> float | None:
    """A ``YYYY-MM-DD`` day (UTC) as a timestamp: its first second, or its last with ``end``."""
    if not value:
        return None
    try:
        start = timegm(time.strptime(value, "%Y-%m-%d"))
    except ValueError:
        raise InvalidInputError(f"{name} must be a date YYYY-MM-DD, got {value[:40]!r}") from None
    return float(start + 86400 - 1e-3 if end else start)


async def _body(request: Request) -> bytes:
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise InvalidInputError(f"the form is over {MAX_FORM_BYTES >> 20} MiB")
    return body


def _human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:,.0f} {unit}" if unit == "B" else f"{size:,.1f} {unit}"
        size /= 1024
    return f"{n} B"
