"""A shard's lease: which copy of a shard may serve, so two never serve at once.

The lease is a small JSON file (``<root>/_shards/<shard>.lease``: owner token, expiry in
Unix seconds) changed only under a short ``flock`` on ``<shard>.lease.lock`` (held for one
read and one rename, never while serving). The owner renews it every T/4 seconds; a copy
whose renewals stop (its node hung, its process stopped) loses it T seconds after the
last renewal, and a new copy takes it. The old copy, if it ever runs again, sees that its
last renewal is older than T and stops serving before it touches a store. Clocks of the
nodes must agree to well under T (NTP does).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator

from ..namespaces import make_private_dirs


class Lease:
    def __init__(self, directory: str, shard: int, token: str, seconds: float) -> None:
        make_private_dirs(directory)
        self.path = os.path.join(directory, f"{shard:03d}.lease")
        self.token = token
        self.seconds = seconds
        self.valid_until = 0.0  # wall clock: this copy may serve until then

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def holder(self) -> dict[str, object] | None:
        try:
            with open(self.path, "rb") as f:
                found = json.load(f)
        except (FileNotFoundError, ValueError):
            return None
        return found if isinstance(found, dict) else None

    def _write(self, expires: float) -> None:
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump({"owner": self.token, "expires": expires}, f)
        os.replace(tmp, self.path)

    def acquire(self) -> bool:
        """Take the lease if it is free, expired or ours; renew it if ours. False when
        another copy holds it; raises ``LeaseLost`` when we held it and it was taken."""
        with self._locked():
            now = time.time()
            found = self.holder()
            if found is not None and found.get("owner") != self.token:
                expires = found.get("expires")
                if isinstance(expires, (int, float)) and expires > now:
                    if self.valid_until:
                        raise LeaseLost(f"the lease was taken by {found.get('owner')}")
                    return False
            if self.valid_until and now > self.valid_until:
                raise LeaseLost("the lease ran out before it was renewed (this copy was stopped)")
            self._write(now + self.seconds)
            # A margin of a quarter of T: we stop serving before another copy may start.
            self.valid_until = now + self.seconds * 0.75
            return True

    def release(self) -> None:
        with contextlib.suppress(OSError), self._locked():
            found = self.holder()
            if found is not None and found.get("owner") == self.token:
                os.unlink(self.path)
        self.valid_until = 0.0

    def valid(self) -> bool:
        return time.time() < self.valid_until


class LeaseLost(Exception):
    """This copy of the shard no longer holds its lease: it must stop serving."""
