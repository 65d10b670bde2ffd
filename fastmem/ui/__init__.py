"""``fastmem ui``: a local web inspector for one store (the extra ``fastmem[ui]``).

It shows what ``MemoryStore.context()`` did for a question and a budget (each line's level,
tokens and reason, and what ranked well but did not fit), and around that an overview, a
timeline, search, changes and a live view of other processes' writes. It uses the public
API only, so what it shows is what an agent gets.

>>> from fastmem import ui  # doctest: +SKIP
>>> ui.serve("agent_memory", port=8765)  # doctest: +SKIP

Importing this package loads nothing heavy; :func:`create_app` and :func:`serve` import
Starlette, Jinja2 and uvicorn when called, and raise
:class:`~fastmem.DependencyUnavailableError` naming ``fastmem[ui]`` when they are missing.
"""

from __future__ import annotations

import importlib
from typing import Any

from fastmem.errors import DependencyUnavailableError

__all__ = ["REQUIRES", "create_app", "require", "serve"]

# What the inspector imports: (module, distribution). pyproject's ``ui`` extra installs them.
REQUIRES = (("starlette", "starlette"), ("jinja2", "jinja2"), ("uvicorn", "uvicorn"))


def require(modules: tuple[tuple[str, str], ...] = REQUIRES) -> None:
    """Check that the inspector's dependencies import.

    Raises:
        DependencyUnavailableError: one is missing; the message names ``fastmem[ui]``.
    """
    missing = []
    for module, dist in modules:
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(dist)
    if missing:
        raise DependencyUnavailableError(
            f"the inspector needs {', '.join(missing)}: pip install 'fastmem[ui]'"
        )


def create_app(*args: Any, **kwargs: Any) -> Any:
    """The inspector's ASGI application (see :func:`fastmem.ui.app.create_app`)."""
    require(REQUIRES[:2])
    from .app import create_app as create

    return create(*args, **kwargs)


def serve(*args: Any, **kwargs: Any) -> int:
    """Run the inspector until interrupted (see :func:`fastmem.ui.server.serve`)."""
    require()
    from .server import serve as run

    return run(*args, **kwargs)
