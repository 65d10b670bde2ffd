"""Recall: which memories answer a question, and the context a model reads.

A question's trip (``query``): ranked (``ranking``: the hybrid of vector and keyword search,
with ``vector_search``'s scans; ``speakers``: whose question it is), then packed
(``packing``: the levels and the packer, never over the budget). What the ranking hands the
packer is in ``hits``; the packer calls nothing of the ranking. ``supersedes`` follows a
memory to its newest version; ``preload`` is level 2, the important memories read in the
background after a restart.

It may import ``fastmem.storage`` and everything below it, never the facade or the edge.
Nothing here is public: ``MemoryStore.search`` and ``MemoryStore.context`` are.
"""
