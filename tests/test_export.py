"""fastmem.export: the JSON shape of a memory, shared by the CLI and the MCP server."""

from __future__ import annotations

import doctest
import json
import math

import pytest

import fastmem
from fastmem import export
from fastmem.types import Memory


@pytest.fixture(autouse=True)
def backend():
    """The JSON shape exercises no kernel: one run, on the default kernels (the
    compiled ones when built), not one per backend as tests/conftest.py's fixture would."""
    yield fastmem.BACKEND


def test_the_docstring_example_runs():
    assert doctest.testmod(export, raise_on_error=True).attempted > 0


def test_a_memory_round_trips_through_json_with_bytes_anywhere_in_metadata():
    metadata = {"raw": b"\x00\xff", "nested": {"list": [b"a", 1, None, (b"b", 2.5)]}, "f": math.inf}
    m = Memory("m3", "text", "fact", 1.5e9, "s1", 0.25, False, metadata, "a summary")
    line = json.loads(json.dumps(export.memory_dict(m)))
    assert list(line) == list(export.EXPORT_FIELDS)
    assert line["metadata"]["raw"] == {export.BYTES_TAG: "AP8="}
    assert export.from_jsonable(line["metadata"]) == {
        "raw": b"\x00\xff", "nested": {"list": [b"a", 1, None, [b"b", 2.5]]}, "f": math.inf}  # fmt: skip
    assert export.from_jsonable(line["text"]) == "text"


def test_a_dict_that_only_looks_tagged_stays_a_dict():
    assert export.from_jsonable({export.BYTES_TAG: 1}) == {export.BYTES_TAG: 1}
    assert export.from_jsonable({export.BYTES_TAG: "AA==", "other": 1}) == {export.BYTES_TAG: "AA==", "other": 1}
    with pytest.raises(ValueError):
        export.from_jsonable({export.BYTES_TAG: "not base64!"})
