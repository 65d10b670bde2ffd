"""The storage engine: a store's two files and everything that reads or writes them.

What lives here, bottom to top: the data file's I/O (``fileio``: OS errors mapped, group
commit, torn tails), vectors and keyword postings as the index keeps them (``vectors``,
``keyword_index``, ``index_tail``), records read back and other processes' appends replayed
(``replay``), the index (``index``), what ``add`` accepts and how records are written
(``records``), recovery at open (``recovery``), checkpoints (``checkpoint``), access counts
merged across processes (``access_counts``), importance scores (``importance``), forget's
erase (``erase``), a handle's state built from the files (``handle_state``), the writer lock's
pacing (``writelock``), the engine itself (``engine``), and over it maintenance (compaction,
repair, backup, verify: ``maintenance``) and ``stats()`` (``stats``).

It may import the values at the bottom of the package (``fastmem.errors``, ``types``,
``namespaces``, ``_format``, ``_threads``), the kernels (``fastmem._kernels``) and the models a
memory is written with (``fastmem.embed``, ``tokens``, ``summarize``); never ``fastmem.recall``,
the facade or the edge. Nothing here is public: ``fastmem.MemoryStore`` is.
"""
