"""The kernels: the compiled ones (``_ext``, built from ``src_cython/``) beside their
readable numpy references (``reference``, ``keyword_reference``, ``bpe_reference``,
``index_open_reference``), which the tests hold them to; and this module, which chooses.
They may import ``fastmem.errors`` and ``fastmem._format`` (the bytes they read), nothing else
of fastmem's.

Choose the kernels: compiled (``fastmem._kernels._ext``) or the numpy reference.

``FASTMEM_BACKEND`` selects: ``auto`` (default; compiled when it was built), ``cython``
(compiled, or ImportError) or ``python`` (the reference). Other modules call the kernels
through this module's attributes, so ``use()`` switches them at run time (the tests do).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the kernels' signatures, for type checkers; use() binds them at import
    from .reference import (  # noqa: F401
        Cl100kCounter,
        bm25_topk,
        check_record,
        crc32,
        current_slot,
        dat_header,
        delta_header,
        dot_half,
        file_size,
        frame_records,
        gather_vectors,
        hot_section,
        idx_header,
        idx_open,
        importance,
        memory_ids,
        memory_rows,
        merge_postings,
        merge_postings_runs,
        pack_memories,
        prepare_batch,
        quantize_half,
        ranks_file,
        read_hot,
        read_memory,
        record_payload,
        scan_records,
        sort_postings,
        to_half,
        to_half_quantized,
        tokenize_batch,
        topk_int8,
        unpack,
    )

BACKEND: str = "python"

_NAMES = ("crc32", "scan_records", "frame_records", "check_record", "record_payload",
          "file_size", "read_memory", "read_hot", "dat_header", "idx_header", "current_slot",
          "delta_header", "hot_section", "idx_open", "unpack", "pack_memories",
          "topk_int8", "dot_half", "to_half", "quantize_half", "to_half_quantized", "importance",
          "tokenize_batch", "bm25_topk", "merge_postings", "merge_postings_runs", "sort_postings",
          "prepare_batch", "gather_vectors", "memory_ids", "Cl100kCounter", "ranks_file",
          "memory_rows")  # fmt: skip


def use(backend: str) -> str:
    """Select ``"auto"``, ``"cython"`` or ``"python"`` kernels; returns the one loaded."""
    global BACKEND
    if backend not in ("auto", "cython", "python"):
        raise ImportError(
            f"FASTMEM_BACKEND={backend!r} is not one of 'auto', 'cython', 'python'"
        )
    BACKEND = "python"
    if backend != "python":
        # The top-k scan's OpenMP threads otherwise spin for a while after each scan, taking
        # a core from the caller's other threads (a server's next request, a writer) on small
        # machines. libgomp reads this once, as the first compiled kernel loads it; a user's
        # own setting stands.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        try:
            from ._ext import bpe, heads, items, keyword, reader, records, scoring, topk, vectors
        except ImportError as exc:
            if backend == "cython":
                raise ImportError(
                    "FASTMEM_BACKEND=cython, but fastmem's compiled extension is missing: "
                    "reinstall with 'pip install --force-reinstall --no-binary fastmem fastmem' "
                    "on a machine with a C compiler, or set FASTMEM_BACKEND=python"
                ) from exc
        else:
            BACKEND = "cython"
            compiled = {**vars(records), **vars(reader), **vars(heads), **vars(scoring),
                        **vars(topk), **vars(vectors), **vars(keyword), **vars(items), **vars(bpe)}
            for name in _NAMES:
                globals()[name] = compiled[name]
            return BACKEND
    # The numpy reference (with its own imports: the token counter's Python BPE, bisect...)
    # is imported only when it is used: with the compiled kernels, never.
    from . import reference as _kernels_py

    for name in _NAMES:
        globals()[name] = getattr(_kernels_py, name)
    return BACKEND


def _warn_if_source_tree() -> None:
    """Warn (once: this runs at import) when fastmem is imported from a checkout whose
    kernels were never built, as ``python -c 'import fastmem'`` in the repository does: it
    silently runs the numpy fallback, several times slower. An explicit FASTMEM_BACKEND=python
    is a choice and gets no warning."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # fastmem/_kernels/
    if os.path.isfile(os.path.join(root, "setup.py")) and os.path.isdir(
        os.path.join(root, "src_cython")
    ):
        import warnings

        warnings.warn(
            f"fastmem is imported from the source tree {root}, whose compiled kernels are not "
            f"built: using the slower numpy fallback. Build them with: cd {root} && python "
            f"setup.py build_ext --inplace (or set FASTMEM_BACKEND=python to silence this)",
            RuntimeWarning,
            stacklevel=2,
        )


use(os.environ.get("FASTMEM_BACKEND", "auto"))
if BACKEND == "python" and "FASTMEM_BACKEND" not in os.environ:  # at import only: once
    _warn_if_source_tree()
