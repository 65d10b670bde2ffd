"""fastmem on a Ray cluster: stores served by shard actors where their files live.

``pip install 'fastmem[ray]'``. Core fastmem never imports this package (nor Ray).

>>> import fastmem.ray                                            # doctest: +SKIP
>>> cluster = fastmem.ray.connect("10.0.0.1:6379", root="/mnt/shared/fastmem")
>>> alice = cluster.open("alice")                                 # MemoryStore's methods
>>> alice.add("Alice's cat is called Tom.", type="fact")
>>> [h.memory.text for h in alice.search("cat", mode="keyword")]
>>> fastmem.ray.jobs.run("compact", "all", cluster=cluster)        # every store, once

Each namespace hashes (SHA-256) to one of 256 slots, forever; a slot is served by one of
``shards`` named, detached actors (``fastmem-shard-NNN``). See the README's "On a Ray
cluster" section for the storage modes and what a node loss does in each.
"""

from __future__ import annotations

from . import jobs  # fastmem.ray.jobs.run(...) after `import fastmem.ray`, as documented
from ._config import SLOTS, Deployment, slot_of
from ._errors import (
           BackupChecksumError,
           ClusterUnreachableError,
           ColdChecksumError,
           RayUnavailableError,
           RestoreRefusedError,
           ShardUnavailableError,
           StoreOwnedElsewhereError,
)
from ._router import Cluster, RemoteStore, connect, open_location

__all__ = ["SLOTS", "BackupChecksumError", "Cluster", "ClusterUnreachableError", "ColdChecksumError", "Deployment",
           "RayUnavailableError", "RemoteStore", "RestoreRefusedError", "ShardUnavailableError",
           "StoreOwnedElsewhereError", "connect", "jobs", "open_location", "slot_of"]
