"""Namespaces: one store per user or profile, so their memories can never mix.

``fastmem.open(root, namespace="alice")`` opens the store ``<root>/alice/memory``
(``memory.dat`` and ``memory.idx``): separate files, a separate lock and a separate index
for each namespace. Nothing a store does reads another store's files, so a search or a
context of one namespace cannot see another's memories, whatever the query or filters.

A namespace name is 1 to 64 characters from ``a-z``, ``0-9``, ``_``, ``-`` and ``.``,
not starting with ``.`` (so no ``..``, no hidden directories and no path separators).
Upper case is refused: on a case-insensitive file system (macOS, Windows) ``Alice`` and
``alice`` would be one directory, so two users would share a store. Map other user ids to
valid names yourself (lower case them, or hash them, e.g. ``hashlib.sha256(uid).hexdigest()[:32]``).

Examples:
    >>> import fastmem, tempfile
    >>> root = tempfile.mkdtemp()
    >>> with fastmem.open(root, namespace="alice") as alice:
    ...     _ = alice.add("Alice's cat is called Tom.")
    >>> with fastmem.open(root, namespace="bob") as bob:
    ...     [h.memory.text for h in bob.search("cat", mode="keyword")]
    []
    >>> fastmem.namespaces.list_namespaces(root)
    ['alice', 'bob']
"""

from __future__ import annotations

import os
import re

from .errors import InvalidInputError, InvalidTypeError

__all__ = ["MAX_NAMESPACE_CHARS", "STORE_NAME", "base_path", "check_namespace", "list_namespaces", "make_private_dirs",
           "namespace_path"]

MAX_NAMESPACE_CHARS = 64
STORE_NAME = "memory"  # <root>/<namespace>/memory.dat and memory.idx
_VALID = re.compile(r"[a-z0-9_-][a-z0-9_.-]{0,63}")


def check_namespace(namespace: object) -> str:
    """Return ``namespace`` if it is a valid name, else raise.

    Raises:
        InvalidTypeError: not a string.
        InvalidInputError: empty, too long, starts with ``.``, or has a character outside
            ``a-z 0-9 _ - .``.
    """
    if not isinstance(namespace, str):
        raise InvalidTypeError(f"namespace must be a string, not {type(namespace).__name__}")
    if _VALID.fullmatch(namespace) is None:
        raise InvalidInputError(
            f"namespace {namespace[:80]!r} is not valid: use 1 to {MAX_NAMESPACE_CHARS} "
            f"characters from a-z, 0-9, '_', '-' and '.', not starting with '.'"
        )
    return namespace


def namespace_path(root: str | os.PathLike[str], namespace: object, *, create: bool) -> str:
    """The store path (without ``.dat``/``.idx``) of ``namespace`` under ``root``; with
    ``create``, makes ``root`` and the namespace's directory (mode 0700) if missing."""
    name = check_namespace(namespace)
    if not isinstance(root, (str, os.PathLike)):
        raise InvalidTypeError(f"root must be a str or os.PathLike, not {type(root).__name__}")
    base = os.fspath(root)
    if not isinstance(base, str) or not base:
        raise InvalidInputError("root must be a non-empty directory name")
    directory = os.path.join(base, name)
    if create:
        make_private_dirs(directory)
    return os.path.join(directory, STORE_NAME)


def make_private_dirs(directory: str) -> None:
    """Create ``directory`` and any missing parent with mode 0700 (``os.makedirs`` gives
    the parents the default mode); existing directories are left as they are."""
    missing = []
    path = os.path.abspath(directory)
    while not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:  # made meanwhile by another process
            pass


def list_namespaces(root: str | os.PathLike[str]) -> list[str]:
    """The namespaces that have a store under ``root``, sorted."""
    base = os.fspath(root)
    try:
        names = os.listdir(base)
    except FileNotFoundError:
        return []
    return sorted(
        name for name in names
        if _VALID.fullmatch(name) and os.path.exists(os.path.join(base, name, STORE_NAME + ".dat"))
    )  # fmt: skip


def base_path(path: object) -> str:
    """A store's name, checked: what ``fastmem.open`` takes, without a ``.dat`` or ``.idx``
    suffix (its files are ``<name>.dat`` and ``<name>.idx``)."""
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidTypeError(f"path must be a str or os.PathLike, not {type(path).__name__}")
    base = os.fspath(path)
    if not isinstance(base, str) or not base:
        raise InvalidInputError("path must be a non-empty file name")
    try:
        if b"\0" in os.fsencode(base):
            raise ValueError
    except (UnicodeError, ValueError):
        raise InvalidInputError(f"path {base!r} is not a valid file name") from None
    return base[:-4] if base.endswith((".dat", ".idx")) else base
