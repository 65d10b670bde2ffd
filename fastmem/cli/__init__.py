"""``fastmem``: the command line for operators and for trying fastmem out (``demo``: the
demonstration ``fastmem demo`` runs). Part of the edge, with ``fastmem.integrations``,
``fastmem.ui`` and ``fastmem.ray``: it imports the public API only.

Commands (``fastmem COMMAND --help`` for each one's options)::

    fastmem demo [--path P]                 an agent session written, the process ended, reopened
    fastmem stats PATH                      counts, types, sessions, sizes
    fastmem inspect PATH [ID] [--largest N] one memory in full, or the largest ones
    fastmem search PATH QUERY [-k K] [--mode hybrid|vector|keyword]
    fastmem context PATH QUERY [--budget N] the packed context a model would get
    fastmem verify PATH                     check every record and the index
    fastmem repair PATH                     keep every intact record, rebuild the index
    fastmem compact PATH                    reclaim forgotten memories' space
    fastmem reembed PATH                    rewrite every vector with the default model
    fastmem export PATH [-o FILE]           every live memory as JSON lines
    fastmem import PATH FILE                JSON lines (as export writes them) into a store
    fastmem hermes install [--hermes-home DIR] [--activate]
    fastmem mcp --store PATH [--timeout S]  an MCP server over stdio (any number per store)
    fastmem ui PATH [--port N] [--readonly] a local web inspector (fastmem[ui])

``PATH`` is a store's name (``PATH.dat`` + ``PATH.idx``), or with ``--namespace NAME`` the
root directory of namespaced stores. Commands that only read open the store read-only, so
they work while an agent is writing to it. ``--json`` prints one JSON document (``export``:
JSON lines) on stdout for scripts. Progress bars go to stderr, only when it is a terminal
and without ``--json``. Every error is one line on stderr.

Exit codes:
    0  success
    1  problems found (``verify`` found damage, ``repair`` had to cut damaged data away),
       or the operation failed for another reason
    2  usage error: bad arguments or option values, an import file that is not valid
    3  the store is locked: another process held its writer lock past ``--timeout``
    4  damaged or unreadable files: the store (or a file given) cannot be read
    5  not found: no store at PATH, no memory with that ID, no such file
    6  something needed is not installed: the embedding model, the ``mcp`` package
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import json
import math
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn, TextIO

from .. import LOCK_TIMEOUT, export
from ..errors import (
    CorruptionError,
    DependencyUnavailableError,
    DurabilityError,
    EmbedderMismatchError,
    EmbedderUnavailableError,
    FastmemError,
    FormatVersionError,
    InvalidInputError,
    RecoveryWarning,
    StoreFullError,
    StoreLockedError,
    StoreNotFoundError,
    UnknownMemoryError,
)
from ..export import BYTES_TAG, EMBEDDING_FIELD, EXPORT_FIELDS, from_jsonable, memory_dict

__all__ = ["main", "EXIT_OK", "EXIT_PROBLEMS", "EXIT_USAGE", "EXIT_LOCKED", "EXIT_DAMAGED",
           "EXIT_NOT_FOUND", "EXIT_MISSING"]

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_USAGE = 2
EXIT_LOCKED = 3
EXIT_DAMAGED = 4
EXIT_NOT_FOUND = 5
EXIT_MISSING = 6

IMPORT_CHUNK = 512  # memories per add_many: one write and one commit each


class CliError(Exception):
    """An error the CLI reports as one line, with its exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def exit_code(exc: BaseException) -> int:
    """The exit code that says what kind of failure ``exc`` is (see the module docstring)."""
    if isinstance(exc, CliError):
        return exc.code
    if isinstance(exc, StoreLockedError):
        return EXIT_LOCKED
    if isinstance(exc, (StoreNotFoundError, UnknownMemoryError, FileNotFoundError)):
        return EXIT_NOT_FOUND
    if isinstance(exc, (CorruptionError, FormatVersionError)):
        return EXIT_DAMAGED
    if isinstance(exc, DependencyUnavailableError):  # the model, an encoding, the mcp package
        return EXIT_MISSING
    if isinstance(exc, InvalidInputError):
        return EXIT_USAGE
    if isinstance(exc, OSError):  # permission denied, a directory where a file should be...
        return EXIT_DAMAGED
    return EXIT_PROBLEMS


def _one_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, OSError) and exc.strerror and exc.filename:
        text = f"{exc.filename}: {exc.strerror}"
    return " ".join(text.split())


# --- argument parsing ------------------------------------------------------------------


def _columns() -> int:
    """``shutil.get_terminal_size().columns`` (``$COLUMNS``, else the terminal's, else 80),
    without importing shutil."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


class _Formatter(argparse.HelpFormatter):
    """argparse's help layout, its width found without shutil: argparse imports shutil (and
    with it bz2 and lzma, ~3 ms of CPU) for every argument added, on every command's start."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:  # fmt: skip
        super().__init__(prog, indent_increment, max_help_position,
                         _columns() - 2 if width is None else width)  # fmt: skip


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (exit 2), not usage + message."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"fastmem: error: {message} (see '{self.prog} --help')\n")
        raise SystemExit(EXIT_USAGE)


def _seconds_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value <= 86400:
        raise argparse.ArgumentTypeError("seconds must be from 0 to 86400")
    return value


def _namespace_arg(value: str) -> str:
    from ..namespaces import check_namespace

    try:
        return check_namespace(value)
    except InvalidInputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _int_arg(lo: int, hi: int) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
        if not lo <= n <= hi:
            raise argparse.ArgumentTypeError(f"{n} is not from {lo} to {hi}")
        return n

    parse.__name__ = "number"  # what argparse names in its message
    return parse


def _text_arg(what: str) -> Callable[[str], str]:
    def parse(value: str) -> str:
        if not value.strip():
            raise argparse.ArgumentTypeError(f"the {what} is empty")
        return value

    parse.__name__ = what
    return parse


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = _Parser(prog="fastmem", description="Embedded, persistent memory for AI agents.",
                     epilog="Exit codes: 0 ok, 1 problems found, 2 usage error, 3 store locked, "
                            "4 damaged or unreadable files, 5 not found, 6 not installed.")  # fmt: skip
    parser.add_argument("--version", action="version", version=f"fastmem {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    def command(name: str, help: str, *, store: bool = True, json_: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        if store:
            p.add_argument("path", metavar="PATH", help="the store (PATH.dat + PATH.idx), or the "
                           "root directory of namespaced stores with --namespace")  # fmt: skip
            p.add_argument("--namespace", type=_namespace_arg, metavar="NAME",
                           help="the store of one user or profile under PATH")  # fmt: skip
        if json_:
            p.add_argument("--json", action="store_true", help="print JSON for scripts")
        return p

    p = command("demo", "write an agent session, restart, and show what comes back",
                store=False)  # fmt: skip
    p.add_argument("--path", help="where to write the demo store (default: a new temporary "
                   "directory, removed afterwards)")  # fmt: skip
    p.set_defaults(func=_cmd_demo)

    command("stats", "a store's counts, types, sessions and sizes").set_defaults(func=_cmd_stats)

    p = command("inspect", "one memory in full, or the largest ones")
    p.add_argument("id", nargs="?", metavar="ID", help="a memory id such as m42")
    p.add_argument("--largest", type=_int_arg(1, 1_000_000), metavar="N",
                   help="list the N memories with the largest records")  # fmt: skip
    p.set_defaults(func=_cmd_inspect)

    p = command("search", "the memories that best match a query")
    p.add_argument("query", type=_text_arg("query"), metavar="QUERY")
    p.add_argument("-k", type=_int_arg(1, 10_000), default=10, help="how many hits (default 10)")
    p.add_argument("--mode", choices=("hybrid", "vector", "keyword"), default="hybrid",
                   help="hybrid (default), vector (cosine) or keyword (BM25)")  # fmt: skip
    p.add_argument("--session", help="only this session's memories")
    p.add_argument("--type", action="append", dest="types", metavar="TYPE",
                   help="only memories of this type (repeat for several)")  # fmt: skip
    p.set_defaults(func=_cmd_search)

    p = command("context", "the packed context a model would get for a question")
    p.add_argument("query", type=_text_arg("query"), metavar="QUERY")
    p.add_argument("--budget", type=_int_arg(1, 1_000_000), default=1300,
                   help="tokens (default 1300)")  # fmt: skip
    p.add_argument("--session", help="the current session: its memories rank higher")
    p.add_argument("--explain", action="store_true", help="each line's level, tokens and why "
                   "it was chosen, and the candidates that did not fit")  # fmt: skip
    p.set_defaults(func=_cmd_context)

    command("verify", "check every record and the index (exit 1 on damage)").set_defaults(
        func=_cmd_verify)  # fmt: skip
    def writes(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--timeout", type=_seconds_arg, default=LOCK_TIMEOUT, metavar="SECONDS",
                       help="how long to wait for another process's write or compaction "
                            f"(default {LOCK_TIMEOUT:g}; exit 3 after it)")  # fmt: skip
        return p

    writes(command("repair", "keep every intact record and rebuild the index (exit 1 when "
                   "data was cut)")).set_defaults(func=_cmd_repair)  # fmt: skip
    writes(command("compact", "rewrite the live memories, reclaiming forgotten ones' space")
           ).set_defaults(func=_cmd_compact)  # fmt: skip
    writes(command("reembed", "rewrite every memory's vector with the default embedding model "
                   "(after a model change), atomically")).set_defaults(func=_cmd_reembed)  # fmt: skip

    p = command("export", "every live memory as JSON lines, oldest first", json_=False)
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE (default: stdout)")
    p.add_argument("--vectors", action="store_true", help="include each memory's stored "
                   "embedding, so that import keeps it instead of embedding the text again")  # fmt: skip
    p.set_defaults(func=_cmd_export)

    p = writes(command("import", "JSON lines (as export writes them) into a store (created "
                       "if missing); memories get new ids"))  # fmt: skip
    p.add_argument("file", metavar="FILE", help="a JSON-lines file, or - for stdin")
    p.set_defaults(func=_cmd_import)

    hermes = sub.add_parser("hermes", help="Hermes Agent integration")
    hsub = hermes.add_subparsers(dest="hermes_command", metavar="COMMAND", parser_class=_Parser)
    hsub.required = True
    p = hsub.add_parser("install", help="install fastmem as a Hermes Agent memory provider")
    p.add_argument("--hermes-home", metavar="DIR", help="Hermes Agent's home (default: its own)")
    p.add_argument("--activate", action="store_true", help="also set memory.provider: fastmem")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=_cmd_hermes_install)

    command("doctor", "what is installed: version, kernels, embedder, tokenizers, load times",
            store=False).set_defaults(func=lambda args, out: importlib.import_module(
                "fastmem.doctor").run(out))  # fmt: skip

    sub.add_parser("ray", add_help=False,  # parsed by fastmem.ray.cli (see main)
                   help="a Ray cluster's stores: status, fleet jobs (fastmem ray --help)")  # fmt: skip
    p = sub.add_parser("mcp", help="run an MCP server over stdio for one store")
    p.add_argument("--store", required=True, metavar="PATH", help="the store to serve")
    p.add_argument("--namespace", type=_namespace_arg, metavar="NAME",
                   help="the store of one user or profile under PATH")  # fmt: skip
    p.add_argument("--timeout", type=_seconds_arg, default=LOCK_TIMEOUT, metavar="SECONDS",
                   help="how long a write waits for another process's write or compaction "
                        f"(default {LOCK_TIMEOUT:g}; then the tool call fails, naming that process)")  # fmt: skip
    p.set_defaults(func=_cmd_mcp)

    p = command("ui", "a local web inspector: what a context holds and why, timeline, search, "
                "changes (needs fastmem[ui])", json_=False)  # fmt: skip
    p.add_argument("--port", type=_int_arg(0, 65535), metavar="N", help="default 8765 (or a free one)")
    p.add_argument("--host", default="127.0.0.1", help="the address to bind (default loopback)")
    p.add_argument("--readonly", action="store_true", help="no changes: pin, forget, edit, add are off")
    p.add_argument("--no-browser", action="store_true", help="print the address, do not open it")
    p.set_defaults(func=_cmd_ui)
    return parser


# --- output ----------------------------------------------------------------------------


class _Out:
    """Where a command writes: rich for people, JSON for scripts, progress on stderr."""

    def __init__(self, as_json: bool) -> None:
        self.json = as_json
        # Progress bars only for a person watching: never in a pipe, a log or with --json.
        self.progress_on = not as_json and sys.stderr.isatty()

    # rich is imported by the first print for a person (~40 ms in a fresh process): a
    # command answering in JSON (a hook's `fastmem context --json`) never loads it.
    # No emoji codes: memories' text is shown as it is (":smile:" stays that). Stored
    # text in markup strings goes through escape() (see _e), or "[/x]" would be a tag.
    @functools.cached_property
    def console(self) -> Any:
        from rich.console import Console

        return Console(highlight=False, soft_wrap=False, emoji=False)

    @functools.cached_property
    def err(self) -> Any:
        from rich.console import Console

        return Console(stderr=True, highlight=False, emoji=False)

    def emit(self, data: Any) -> None:
        sys.stdout.write(json.dumps(data, ensure_ascii=False, indent=2) + "\n")

    def note(self, message: str) -> None:
        """A remark for the person (never on stdout, where JSON or data goes)."""
        sys.stderr.write(f"fastmem: {message}\n")

    @contextmanager
    def progress(self, what: str, total: float | None,
                 bytes_: bool = False) -> Iterator[Callable[[float], None]]:  # fmt: skip
        """A progress bar on stderr; yields ``advance(n)``. ``total=None``: a spinner with
        the time elapsed, for work that reports no progress; ``bytes_``: sizes, not counts."""
        from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress,
                                   SpinnerColumn, TextColumn, TimeElapsedColumn,
                                   TimeRemainingColumn)  # fmt: skip

        columns: list[Any] = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn()]
        if total is not None:
            columns += [DownloadColumn() if bytes_ else MofNCompleteColumn(), TimeRemainingColumn()]
        columns.append(TimeElapsedColumn())
        with Progress(*columns, console=self.err, transient=True,
                      disable=not self.progress_on) as bar:  # fmt: skip
            task = bar.add_task(what, total=total)
            yield lambda n: bar.advance(task, n)


def _e(text: str) -> str:
    """Stored or user text, safe inside rich markup."""
    from rich.markup import escape

    return escape(text)


def _when(ts: float | None) -> str:
    if ts is None or not math.isfinite(ts):
        return "-"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))
    except (OverflowError, OSError, ValueError):
        return repr(ts)


def _preview(text: str, n: int = 100) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= n else flat[: n - 1] + "…"


def _human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


# --- opening stores --------------------------------------------------------------------


def _base(args: argparse.Namespace) -> str:
    """The store's name (its files are ``<name>.dat``, ``.idx``), namespace resolved."""
    from ..namespaces import base_path, namespace_path

    if args.namespace is not None:
        return namespace_path(args.path, args.namespace, create=False)
    return base_path(args.path)


def _require_store(args: argparse.Namespace) -> str:
    base = _base(args)
    if not os.path.exists(base + ".dat"):
        hint = ""
        if args.namespace is None and os.path.isdir(args.path):
            from ..namespaces import list_namespaces

            names = list_namespaces(args.path)
            if names:
                shown = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")
                hint = f"; {args.path} holds namespaced stores ({shown}): add --namespace NAME"
        raise StoreNotFoundError(f"no fastmem store at {base}.dat{hint}")
    return base


def _open_readonly(args: argparse.Namespace, embedder: Any = None, preload: bool = False) -> Any:
    import fastmem

    policy = None if preload else fastmem.ContextPolicy(preload=0)
    return fastmem.open(_require_store(args), readonly=True, embedder=embedder, policy=policy)


def _query_embedder(out: _Out, without: str = "keyword search only", one_shot: bool = False) -> Any:
    """The embedder searches, contexts and imports use: the default model (unless
    ``FASTMEM_EMBEDDER=none``), or ``None`` with a note (``without``: what that means)
    when it is not installed. ``one_shot``: a model of its own that loads onnxruntime only
    if asked to (a search or context embeds its one question in numpy, see
    ``MiniLM.encode_query_now``: ~35 ms of CPU against ~150 for onnxruntime's load)."""
    choice = os.environ.get("FASTMEM_EMBEDDER", "default")
    if choice not in ("default", "none"):
        raise CliError(f"FASTMEM_EMBEDDER must be 'default' or 'none', not {choice!r}", EXIT_USAGE)
    if choice == "none":
        return None
    from ..embed import MiniLM, default_embedder

    try:
        return MiniLM(background=False) if one_shot else default_embedder()
    except EmbedderUnavailableError as exc:
        out.note(f"{without}: {_one_line(exc)}")
        return None


def _open_for_query(args: argparse.Namespace, out: _Out) -> Any:
    """A read-only store for search and context, with the embedder ready when the store
    has vectors (a command line waits for full quality rather than answer degraded)."""
    embedder = _query_embedder(out, one_shot=True)
    try:
        store = _open_readonly(args, embedder, preload=True)
    except EmbedderMismatchError as exc:
        out.note(f"keyword search only: {_one_line(exc)}")
        return _open_readonly(args, None, preload=True)
    if embedder is not None and len(store) and _has_vectors(store):
        try:
            if getattr(args, "mode", "hybrid") == "vector" or (
                args.query.strip() and embedder.encode_query_now(args.query) is None
            ):
                embedder.wait()  # onnxruntime's load: a text the numpy path refuses
        except BaseException:
            store.close()
            raise
    return store


def _has_vectors(store: Any) -> bool:
    """Whether a memory of ``store`` has a vector: the newest one's record says so in a
    fraction of a millisecond (nearly always yes); only otherwise are they all counted
    (``stats()``: ~130 ms of CPU at 1M memories, numpy.ma's import included)."""
    newest = store.recent(1)
    if newest and store.info(newest[0].id).has_vector:
        return True
    return bool(store.stats().with_vector)


# --- commands --------------------------------------------------------------------------


def _cmd_stats(args: argparse.Namespace, out: _Out) -> int:
    with _open_readonly(args) as store:
        stats = dataclasses.asdict(store.stats())
    if args.namespace is not None:
        stats["namespace"] = args.namespace
    if out.json:
        out.emit(stats)
        return EXIT_OK
    from rich.table import Table

    table = Table(title=f"fastmem store {_e(stats['path'])}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("memories", f"{stats['memories']:,}")
    table.add_row("forgotten", f"{stats['forgotten']:,} (space reclaimed by compact)")
    table.add_row("pinned", f"{stats['pinned']:,}")
    table.add_row("types", _e(", ".join(f"{k} {v:,}" for k, v in stats["types"].items()) or "-"))
    table.add_row("sessions", f"{stats['sessions']:,}")
    table.add_row("time span", f"{_when(stats['oldest'])} → {_when(stats['newest'])}")
    table.add_row("text tokens", f"{stats['text_tokens']:,} (cl100k_base)")
    table.add_row("vectors", f"{stats['with_vector']:,} × {stats['dim']} dims" if stats["dim"]
                  else "none (keyword search only)")  # fmt: skip
    table.add_row("files", f".dat {_human_bytes(stats['dat_bytes'])}, "
                  f".idx {_human_bytes(stats['idx_bytes'])}")  # fmt: skip
    table.add_row("kernels", stats["backend"])
    out.console.print(table)
    return EXIT_OK


def _cmd_inspect(args: argparse.Namespace, out: _Out) -> int:
    if args.id is None and args.largest is None:
        raise CliError("give a memory ID or --largest N", EXIT_USAGE)
    if args.id is not None and args.largest is not None:
        raise CliError("give a memory ID or --largest N, not both", EXIT_USAGE)
    with _open_readonly(args) as store:
        if args.id is not None:
            memory = memory_dict(store.get(args.id))
            stored = dataclasses.asdict(store.info(args.id))
            if out.json:
                out.emit({**memory, "stored": stored})
                return EXIT_OK
            from rich.table import Table

            table = Table(title=f"memory {memory['id']}", show_header=False, title_justify="left")
            table.add_column(style="bold")
            table.add_column(overflow="fold")
            for name in EXPORT_FIELDS[1:]:
                value = memory[name]
                if name == "timestamp":
                    value = f"{_when(value)} ({value})"
                elif isinstance(value, (dict, list)):
                    value = json.dumps(value, ensure_ascii=False)
                table.add_row(name, "-" if value is None else _e(str(value)))
            table.add_row("stored", f"record of {stored['record_bytes']:,} bytes at offset "
                          f"{stored['record_offset']:,}; {stored['text_tokens']} text + "
                          f"{stored['summary_tokens']} summary tokens; "
                          f"{'a vector' if stored['has_vector'] else 'no vector'}")  # fmt: skip
            table.add_row("used", f"{stored['access_count']} times in contexts (last "
                          f"{_when(stored['last_access'])}); importance score "
                          f"{stored['importance_score']:.3f}")  # fmt: skip
            out.console.print(table)
            return EXIT_OK
        rows = [(mid, size, tokens, store.get(mid)) for mid, size, tokens in store.largest(args.largest)]
    if out.json:
        out.emit([{"id": mid, "record_bytes": size, "text_tokens": tokens, "type": m.type,
                   "preview": _preview(m.text)} for mid, size, tokens, m in rows])  # fmt: skip
        return EXIT_OK
    from rich.table import Table

    table = Table(title=f"the {len(rows)} largest memories", title_justify="left")
    for name, justify in (("id", "left"), ("bytes", "right"), ("tokens", "right"),
                          ("type", "left"), ("text", "left")):  # fmt: skip
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for mid, size, tokens, m in rows:
        table.add_row(mid, f"{size:,}", f"{tokens:,}", _e(m.type), _e(_preview(m.text, 60)))
    out.console.print(table)
    return EXIT_OK


def _cmd_search(args: argparse.Namespace, out: _Out) -> int:
    with _open_for_query(args, out) as store:
        hits = store.search(args.query, args.k, mode=args.mode, session=args.session, types=args.types)
    if out.json:
        out.emit([{"score": h.score, "vector": h.vector, "keyword": h.keyword,
                   **memory_dict(h.memory)} for h in hits])  # fmt: skip
        return EXIT_OK
    from rich.table import Table

    table = Table(title=f"{len(hits)} hits for {_e(repr(args.query))} ({args.mode})", title_justify="left")
    for name in ("id", "score", "type", "session", "when", "text"):
        table.add_column(name, justify="right" if name == "score" else "left")
    for h in hits:
        m = h.memory
        table.add_row(m.id, f"{h.score:.3f}", _e(m.type), _e(m.session or "-"), _when(m.timestamp),
                      _e(_preview(m.text)))  # fmt: skip
    out.console.print(table)
    return EXIT_OK


def _cmd_context(args: argparse.Namespace, out: _Out) -> int:
    with _open_for_query(args, out) as store:
        ctx = store.context(args.query, args.budget, session=args.session)
    if out.json:
        out.emit({"text": ctx.text, "tokens": ctx.tokens, "budget": ctx.budget,
                  "encoding": ctx.encoding, "degraded": ctx.degraded, "seconds": ctx.seconds,
                  "items": [{"id": i.id, "level": i.level, "score": i.score,
                             "summary": i.summary, "text": i.text} for i in ctx.items]}
                 if not args.explain else _explained(ctx))  # fmt: skip
        return EXIT_OK
    if args.explain:
        return _print_explained(ctx, out)
    from rich.panel import Panel
    from rich.text import Text

    mode = "keywords, recency and importance (no vectors)" if ctx.degraded else "full quality"
    out.console.print(Panel(Text(ctx.text or "(empty)"), title=f"context for {_e(repr(args.query))}",
                            subtitle=f"{ctx.tokens} / {ctx.budget} {ctx.encoding} tokens, "
                                     f"{len(ctx.items)} memories, {1000 * ctx.seconds:.1f} ms, {mode}",
                            title_align="left", subtitle_align="left"))  # fmt: skip
    return EXIT_OK


def _explained(ctx: Any) -> dict[str, Any]:
    """``context --explain --json``: the context with every item's and left-out's fields."""
    def item(i: Any) -> dict[str, Any]:
        return {**dataclasses.asdict(i), "level": i.level.name.lower()}

    return {"text": ctx.text, "tokens": ctx.tokens, "budget": ctx.budget, "encoding": ctx.encoding,
            "degraded": ctx.degraded, "seconds": ctx.seconds,
            "items": [item(i) for i in ctx.items], "left_out": [item(i) for i in ctx.left_out]}  # fmt: skip


def _print_explained(ctx: Any, out: _Out) -> int:
    """``context --explain``: one row per line of the context, then what did not fit."""
    from rich.table import Table

    for title, items in ((f"context: {ctx.tokens} / {ctx.budget} {ctx.encoding} tokens, "
                          f"{len(ctx.items)} memories, {1000 * ctx.seconds:.1f} ms", ctx.items),
                         (f"ranked well, did not fit ({len(ctx.left_out)})", ctx.left_out)):  # fmt: skip
        table = Table(title=title, title_justify="left")
        for name in ("id", "level", "tokens", "why", "text"):
            table.add_column(name, justify="right" if name == "tokens" else "left",
                             overflow="fold", ratio=3 if name in ("why", "text") else None)  # fmt: skip
        for i in items:
            table.add_row(i.id, i.level.name.lower(), str(i.tokens), _e(i.reason), _e(_preview(i.text, 80)))
        out.console.print(table)
    return EXIT_OK


def _problems(problems: Sequence[Any]) -> list[dict[str, Any]]:
    return [{"file": p.file, "offset": p.offset, "message": p.message} for p in problems]


def _cmd_verify(args: argparse.Namespace, out: _Out) -> int:
    with _open_readonly(args) as store:
        report = store.verify()
    if out.json:
        out.emit({"ok": report.ok, "records": report.records, "bytes": report.bytes,
                  "problems": _problems(report.problems)})  # fmt: skip
    elif report.ok:
        out.console.print(f"[green]ok[/green]: {report.records:,} records, "
                          f"{_human_bytes(report.bytes)}, index matches the data file")  # fmt: skip
    else:
        out.console.print(f"[red]{len(report.problems)} problem(s)[/red] "
                          f"({report.records:,} intact records):")  # fmt: skip
        for p in report.problems:
            out.console.print(f"  {p.file} offset {p.offset}: {_e(p.message)}")
        out.console.print("run 'fastmem repair' to keep every intact record and rebuild the index")
    return EXIT_OK if report.ok else EXIT_PROBLEMS


@contextmanager
def _file_progress(out: _Out, what: str, watched: str, total: int) -> Iterator[None]:
    """A bar for work that writes ``watched`` up to about ``total`` bytes (a compaction's
    or a repair's new data file), polled from a thread: the store reports no progress."""
    with out.progress(what, total or None, bytes_=True) as advance:
        done = threading.Event()

        def poll() -> None:
            last = 0
            while not done.wait(0.1):
                try:
                    size = min(os.path.getsize(watched), total)
                except OSError:
                    continue  # not created yet, or renamed into place
                advance(size - last)
                last = size

        thread = threading.Thread(target=poll, daemon=True)
        if out.progress_on:
            thread.start()
        try:
            yield
        finally:
            done.set()
            if thread.is_alive():
                thread.join()


def _cmd_repair(args: argparse.Namespace, out: _Out) -> int:
    import fastmem

    base = _require_store(args)
    with _file_progress(out, "repairing", base + ".dat.compact", os.path.getsize(base + ".dat")):
        report = fastmem.repair(base, timeout=args.timeout)
    if out.json:
        out.emit({"ok": report.ok, "memories": report.memories, "records": report.records,
                  "cut": _problems(report.cut), "cut_bytes": report.cut_bytes,
                  "damaged_path": report.damaged_path, "bytes_before": report.bytes_before,
                  "bytes_after": report.bytes_after})  # fmt: skip
    elif report.ok:
        out.console.print(f"[green]ok[/green]: nothing damaged; {report.memories:,} memories, "
                          f"index rebuilt")  # fmt: skip
    else:
        out.console.print(f"[yellow]repaired[/yellow]: {report.memories:,} memories kept from "
                          f"{report.records:,} intact records; cut {report.cut_bytes:,} bytes:")  # fmt: skip
        for p in report.cut:
            out.console.print(f"  {p.file} offset {p.offset}: {_e(p.message)}")
        if report.damaged_path:
            out.console.print(f"the cut bytes are kept in {_e(report.damaged_path)}")
    return EXIT_OK if report.ok else EXIT_PROBLEMS


def _cmd_compact(args: argparse.Namespace, out: _Out) -> int:
    import fastmem

    base = _require_store(args)
    with fastmem.open(base, embedder=None, timeout=args.timeout,
                      policy=fastmem.ContextPolicy(preload=0, recent=0)) as store:  # fmt: skip
        # The new data file holds the live records: their sizes are the bar's total.
        total = sum(r.bytes for r in store.largest(len(store)))
        with _file_progress(out, "compacting", base + ".dat.compact", total):
            report = store.compact()
    if out.json:
        out.emit({"memories": report.memories, "dropped": report.dropped,
                  "bytes_before": report.bytes_before, "bytes_after": report.bytes_after,
                  "reclaimed": report.reclaimed, "seconds": report.seconds,
                  "lock_seconds": report.lock_seconds})  # fmt: skip
    else:
        out.console.print(f"compacted: {report.memories:,} memories kept, {report.dropped:,} "
                          f"forgotten dropped; {_human_bytes(report.bytes_before)} → "
                          f"{_human_bytes(report.bytes_after)} "
                          f"({100 * report.reclaimed_fraction:.1f}% reclaimed) in "
                          f"{report.seconds:.2f} s")  # fmt: skip
    return EXIT_OK


def _cmd_reembed(args: argparse.Namespace, out: _Out) -> int:
    import fastmem
    from ..embed import default_embedder

    base = _require_store(args)
    embedder = default_embedder()
    # Opened without an embedder: the store may have been written by another model.
    with fastmem.open(base, embedder=None, timeout=args.timeout,
                      policy=fastmem.ContextPolicy(preload=0, recent=0)) as store:  # fmt: skip
        # Each record gains or keeps one vector: its size is the old one's, give or take.
        total = sum(r.bytes for r in store.largest(len(store)))
        started = time.perf_counter()
        with _file_progress(out, "re-embedding", base + ".dat.compact", total):
            count = store.reembed(embedder)
        seconds = time.perf_counter() - started
    if out.json:
        out.emit({"memories": count, "embedder": embedder.name, "dim": embedder.dim,
                  "seconds": seconds})  # fmt: skip
    else:
        out.console.print(f"re-embedded {count:,} memories with {_e(embedder.name)} "
                          f"({embedder.dim} dims) in {seconds:.2f} s")  # fmt: skip
    return EXIT_OK


# --- export and import -----------------------------------------------------------------

def _cmd_export(args: argparse.Namespace, out: _Out) -> int:
    with _open_readonly(args) as store:
        total = len(store)
        target: TextIO
        if args.output is None or args.output == "-":
            target = sys.stdout
            out.progress_on = False  # the bar would interleave with the data on a terminal
        else:
            target = _open_output(args.output)
        n = 0
        try:
            with out.progress("exporting", total) as advance:
                for memory in store:
                    line = memory_dict(memory)
                    if args.vectors:
                        vector = store.vector(memory.id)
                        line[EMBEDDING_FIELD] = None if vector is None else vector.tolist()
                    # NaN and infinities in metadata (msgpack floats) are written as JSON's
                    # common extension (NaN, Infinity); Python's json reads them back.
                    target.write(json.dumps(line, ensure_ascii=False) + "\n")
                    n += 1
                    advance(1)
            target.flush()
        finally:
            if target is not sys.stdout:
                target.close()
    if args.output not in (None, "-"):
        out.note(f"exported {n:,} memories to {args.output}")
    return EXIT_OK


def _open_output(path: str) -> TextIO:
    return open(path, "w", encoding="utf-8", newline="\n")  # noqa: SIM115 - closed by the caller


def _read_import(path: str) -> list[dict[str, Any]]:
    """Every memory of a JSON-lines file, checked for shape (the store checks the values)."""
    allowed = {*EXPORT_FIELDS, EMBEDDING_FIELD}
    items = []
    if path == "-":
        lines = sys.stdin.read().splitlines()
    else:
        if os.path.isdir(path):
            raise CliError(f"{path} is a directory, not a JSON-lines file", EXIT_USAGE)
        with open(path, encoding="utf-8") as f:
            try:
                lines = f.read().splitlines()
            except UnicodeDecodeError as exc:
                raise CliError(f"{path} is not UTF-8 text: {exc.reason} at byte {exc.start}",
                               EXIT_USAGE) from None  # fmt: skip
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}, line {number}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CliError(f"{where}: not valid JSON ({exc.msg})", EXIT_USAGE) from None
        if not isinstance(item, dict):
            raise CliError(f"{where}: expected a JSON object, got {type(item).__name__}", EXIT_USAGE)
        unknown = sorted(set(item) - allowed)
        if unknown:
            raise CliError(f"{where}: unknown fields {unknown}; known: {sorted(allowed)}",
                           EXIT_USAGE)  # fmt: skip
        if "text" not in item:
            raise CliError(f"{where}: no 'text'", EXIT_USAGE)
        item["_id"] = item.pop("id", None)  # the exporting store's: links name it (see relink)
        try:
            if item.get("metadata") is not None:
                item["metadata"], item["_link"] = export.unlink(from_jsonable(item["metadata"]))
        except ValueError as exc:
            raise CliError(f"{where}: bad {BYTES_TAG} value in metadata ({exc})", EXIT_USAGE) from None
        item["_line"] = number
        # JSON null means "not set": the store's own default (e.g. pinned false).
        items.append({k: v for k, v in item.items() if v is not None})
    return items


def _cmd_import(args: argparse.Namespace, out: _Out) -> int:
    import fastmem

    items = _read_import(args.file)  # all of it checked before anything is written
    base = _base(args)
    if args.namespace is not None:
        from ..namespaces import make_private_dirs

        make_private_dirs(os.path.dirname(base))
    embedder = _query_embedder(out, "memories imported without vectors (keyword search only)")
    # summarizer=None: a summary comes back as exported, and a memory exported without one
    # does not get one made up on the way in. durability="always": each chunk is on disk
    # when add_many returns, or cut off when its write or sync fails, so that a failed
    # import says exactly how many memories it imported (one fdatasync per chunk).
    ids: list[str] = []
    try:
        with fastmem.open(base, embedder=embedder, summarizer=None, timeout=args.timeout, durability="always",
                          policy=fastmem.ContextPolicy(preload=0, recent=0)) as store:  # fmt: skip
            _check_items(store, items, args.file)  # a bad line imports nothing, not half a file
            embedding = embedder is not None and any("embedding" not in i for i in items)
            with out.progress("importing" + (" and embedding" if embedding else ""), len(items)) as advance:
                for start in range(0, len(items), IMPORT_CHUNK):
                    chunk = [{k: v for k, v in i.items() if k[0] != "_"}
                             for i in items[start : start + IMPORT_CHUNK]]  # fmt: skip
                    ids += store.add_many(chunk)
                    advance(len(chunk))
                links = [(i.get("_id"), i.get("metadata"), i.get("_link"), m) for i, m in zip(items, ids)]
                for mid, metadata in export.relink(links):
                    store.update(mid, metadata=metadata)
    except (InvalidInputError, EmbedderUnavailableError, OSError) as exc:  # OSError: a full disk, an I/O error
        if not isinstance(exc, (InvalidInputError, EmbedderUnavailableError, StoreFullError, DurabilityError)):
            raise
        if len(ids) == len(items):
            done = f"all {len(ids)} memories were imported, on disk; closing the store failed"
        else:
            done = f"{len(ids)} memories before it were imported" if ids else "nothing was imported"
        raise CliError(f"{args.file}: {_one_line(exc)} ({done})", exit_code(exc)) from None
    result = {"imported": len(ids), "path": base, "first_id": ids[0] if ids else None,
              "last_id": ids[-1] if ids else None}  # fmt: skip
    if out.json:
        out.emit(result)
    else:
        span = f" ({ids[0]}…{ids[-1]})" if ids else ""
        out.console.print(f"imported {len(ids):,} memories into {_e(base)}{span}")
    return EXIT_OK


def _check_items(store: Any, items: list[dict[str, Any]], path: str) -> None:
    """Check every item as ``add`` would, before anything is written (``check_items``
    writes nothing), so the rules cannot drift."""
    try:
        store.check_items([{k: v for k, v in item.items() if k[0] != "_"} for item in items])
    except InvalidInputError as exc:
        line = items[exc.item]["_line"] if exc.item is not None else "?"
        message = _one_line(exc).removeprefix(f"item {exc.item}: ")
        raise CliError(f"{path}, line {line}: {message} (nothing was imported)",
                       EXIT_USAGE) from None  # fmt: skip


# --- integrations and the demo ---------------------------------------------------------


def _cmd_hermes_install(args: argparse.Namespace, out: _Out) -> int:
    try:
        # Imported by name: it is another module's job, and pulls in Hermes Agent's package.
        hermes = importlib.import_module("fastmem.integrations.hermes")
    except ImportError as exc:
        raise CliError(f"the Hermes Agent integration cannot be loaded ({exc}): "
                       f"pip install 'fastmem[hermes]'", EXIT_MISSING) from None  # fmt: skip
    result = hermes.install(args.hermes_home, activate=args.activate)
    if out.json:
        out.emit({"message": result.message, "plugin_dir": str(result.plugin_dir),
                  "config_path": str(result.config_path), "activated": bool(result.activated)})  # fmt: skip
    else:
        out.console.print(_e(str(result.message)))
    return EXIT_OK


def _cmd_ui(args: argparse.Namespace, out: _Out) -> int:
    from .. import ui  # only here: fastmem[ui]'s packages load with this command alone

    ui.require()
    return int(ui.serve(_require_store(args), port=args.port, host=args.host,
                        readonly=args.readonly, browser=not args.no_browser))  # fmt: skip


def _cmd_mcp(args: argparse.Namespace, out: _Out) -> int:
    from ..integrations import mcp_server

    mcp_server.serve(args.store, namespace=args.namespace, timeout=args.timeout)
    return EXIT_OK


def _cmd_demo(args: argparse.Namespace, out: _Out) -> int:
    from . import demo as _demo

    return _demo.run(args.path, out)


def _ray_main(argv: list[str]) -> int:
    """`fastmem ray ...`: fastmem[ray]'s own commands, imported only when asked for."""
    try:
        ray_cli = importlib.import_module("fastmem.ray.cli")
    except ImportError as exc:
        sys.stderr.write(f"fastmem: error: fastmem.ray cannot be loaded ({exc}): "
                         f"pip install 'fastmem[ray]'\n")  # fmt: skip
        return EXIT_MISSING
    return int(ray_cli.main(argv))


# --- entry point -----------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (the console script exits with it)."""
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] == ["ray"]:
        return _ray_main(given[1:])
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version (0) or a usage error (2, already printed)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    out = _Out(getattr(args, "json", False))
    try:
        with warnings.catch_warnings():
            # fastmem's RecoveryWarning (an index rebuilt, damaged bytes kept) as one line too;
            # other warnings keep their filters.
            warnings.simplefilter("default", RecoveryWarning)
            warnings.showwarning = _show_warning
            return int(args.func(args, out))
    except KeyboardInterrupt:
        sys.stderr.write("fastmem: interrupted\n")
        return 130
    except BrokenPipeError:  # `fastmem export store | head`: the reader left; not an error
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - so the exit's flush is quiet
        except OSError:
            pass
        return EXIT_OK
    except (FastmemError, CliError, OSError) as exc:
        message = _one_line(exc)
        if isinstance(exc, CorruptionError) and args.command not in ("repair", "import"):
            message += " (fastmem repair PATH keeps every intact record)"
        sys.stderr.write(f"fastmem: error: {message}\n")
        return exit_code(exc)
    except Exception as exc:  # a bug, or an integration's own error: still one line
        sys.stderr.write(f"fastmem: error: {type(exc).__name__}: {_one_line(exc)}\n")
        return EXIT_PROBLEMS


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: TextIO | None = None, line: str | None = None) -> None:
    sys.stderr.write(f"fastmem: warning: {' '.join(str(message).split())}\n")


if __name__ == "__main__":  # pragma: no cover - python -m fastmem goes through __main__.py
    sys.exit(main())
