"""How a write waits for the writer lock (an flock, which has no timeout): the pace of its
tries, and the gate that lets the longest waiter try first. Policy only: the flock alone
keeps writes apart, so nothing here changes what a write does, only when it gets its turn."""

from __future__ import annotations

import errno
import fcntl
import os
import struct

# A write waiting for the lock polls it (flock has no timeout), first often (writes hold it
# for micro- to milliseconds), then less: a 1 ms poll left the lock idle at every handoff.
# A write that has waited longer than AGING polls more often again, down to
# POLL_OLD at ten times that age: backing off alone favoured newcomers, whose first
# tries come fast.
POLL_FIRST = 0.00005
POLL_MAX = 0.002
AGING = 0.01
POLL_OLD = 0.0002
# A write that has waited GATE_AFTER takes a gate before it tries the lock again: an
# open-file-description lock on one byte far past the end of the data file (Linux; it
# never touches the file's bytes), let go as soon as it holds the lock. Of the long
# waiters, only the one holding the gate tries the lock, every 0.2 ms and without replaying
# meanwhile: after a release the longest waiter tries at once, where a backed-off waiter
# lost to fresh writes again and again (without the gate, one of 5 writers waited 5 s).
# Not from the first try (every write through the gate): strict turns cost throughput, as
# each turn makes the next writer replay the last one's records first (4 writers at 0.24x
# one process, 0.85x without). The gate is fairness only: the flock alone keeps writes
# apart, so a gate lost or missing changes no result.
GATE = getattr(fcntl, "F_OFD_SETLK", None)
GATE_AT = 1 << 62
GATE_AFTER = 0.05


def gate(fd: int, take: bool) -> bool:
    """Take (without waiting) or let go the gate on the data file open as ``fd``; whether
    it is held now, or was let go. A file system without such locks (the call fails
    otherwise than as taken) passes every write through: fairness is lost, nothing else."""
    if GATE is None:
        return True
    kind = fcntl.F_WRLCK if take else fcntl.F_UNLCK
    try:
        fcntl.fcntl(fd, GATE, struct.pack("hhqqi4x", kind, os.SEEK_SET, GATE_AT, 1, 0))
    except OSError as exc:
        return not take or exc.errno not in (errno.EAGAIN, errno.EACCES)  # held by another write
    return True


def poll_max(waited: float) -> float:
    """The longest pause between tries for the lock of a write that has waited ``waited``
    seconds (see ``AGING``)."""
    if waited <= AGING:
        return POLL_MAX
    return max(POLL_OLD, POLL_MAX * AGING / waited)
