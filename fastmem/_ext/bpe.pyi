# Stubs of the compiled token counter; the twin of fastmem._kernels_py.Cl100kCounter.
from collections.abc import Sequence
from typing import Any

from typing_extensions import Self, disjoint_base

CL100K_PATTERN: str

@disjoint_base
class Cl100kCounter:
    def __new__(cls, encoding: Any) -> Self: ...
    def count(self, text: str) -> int: ...
    def count_many(self, texts: Sequence[str]) -> list[int]: ...
