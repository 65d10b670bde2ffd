"""Background loaders that do not hold up the call that started them."""

from __future__ import annotations

import time

START_DELAY = 0.02  # seconds


def let_the_caller_return() -> None:
    """Wait a moment before loading in a background thread.

    Importing an extension (``dlopen``) and the Rust parsers of ``tokenizers`` and
    ``tiktoken`` hold the GIL for tens of milliseconds without a switch; a loader that
    starts at once stalls the ``open()`` that started it (measured at 1 M memories: 6 to
    60 ms with the default embedder, 1.8 ms without). ``open()`` takes about a millisecond,
    so a short sleep lets it return first.
    """
    time.sleep(START_DELAY)
