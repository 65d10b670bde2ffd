"""The errors of fastmem's Ray deployment (all ``fastmem.FastmemError``)."""

from __future__ import annotations

from ..errors import DependencyUnavailableError, FastmemError


class ShardUnavailableError(FastmemError):
    """A shard did not answer within the router's ``retry_for`` seconds: its node is down
    (a ``"local"`` shard waits for its node), it is restarting, or another copy still holds
    its lease. A write whose attempt timed out may have been applied with its answer lost:
    retry a write with the same ``op_id`` (the shard stores an operation id once); a read
    can be retried as it is."""


class ClusterUnreachableError(FastmemError):
    """Nothing answers at the cluster's address (checked with a short TCP connect before
    Ray is asked to join, which would wait a minute or more): a wrong address, the head
    node down, or a firewall."""


class StoreOwnedElsewhereError(FastmemError):
    """The cold tier says another node owns this store (it thawed it and has not frozen it
    back): a store is never served from two nodes."""


class ColdChecksumError(FastmemError):
    """A file thawed from the cold tier does not match the SHA-256 of its manifest: nothing
    was replaced on the node, the frozen copy is left as it is."""


class RayUnavailableError(DependencyUnavailableError):
    """Ray (or fsspec for the cold tier) is not installed: ``pip install 'fastmem[ray]'``."""


class BackupChecksumError(ColdChecksumError):
    """A file of a backup does not match the SHA-256 of its manifest (bit rot, a bad copy):
    nothing was installed; restore an older generation by name (``generation=``)."""


class RestoreRefusedError(FastmemError):
    """A restore found the store's files already on its shard's node (or the store in the
    cold tier): a backup never silently replaces a store; move or remove them first."""
