"""LangGraph's search filters and namespace match conditions, with the semantics of
``langgraph.store.memory.InMemoryStore`` (a comparison with a missing or non-numeric field is
false instead of a ``TypeError``): what :class:`fastmem.integrations.langgraph.FastmemStore`
tests its items with. Pure Python; needs no LangGraph at import."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from langgraph.store.base import MatchCondition

__all__ = ["compile_filter", "does_match", "matches"]


def matches(value: Mapping[str, Any], filter: Mapping[str, Any] | None) -> bool:
    """Whether an item's value passes a search ``filter``, as ``InMemoryStore`` decides
    (a comparison with a missing or non-numeric field is false, not a ``TypeError``).

    Raises:
        ValueError: an operator other than ``$eq $ne $gt $gte $lt $lte``.
    """
    return compile_filter(filter)(value)


def compile_filter(filter: Mapping[str, Any] | None) -> Any:
    """``matches`` for one filter, as a function of a value: the filter is read once, not
    once per item (a search without a query tests every item under its prefix).

    Raises:
        ValueError: an operator other than ``$eq $ne $gt $gte $lt $lte``.
    """
    if not filter:
        return lambda value: True
    tests = [(key, _test(f)) for key, f in filter.items()]

    def check(value: Mapping[str, Any]) -> bool:
        get = value.get
        return all(test(get(key)) for key, test in tests)

    return check


def _test(filter_value: Any) -> Any:
    """A function of an item's field deciding ``_compare(field, filter_value)``."""
    if isinstance(filter_value, dict) and any(k.startswith("$") for k in filter_value):
        for op in filter_value:
            if op not in ("$eq", "$ne") and op not in _ORDER:
                raise ValueError(f"Unsupported operator: {op}")
        ops = list(filter_value.items())
        return lambda v: all(_operator(v, op, operand) for op, operand in ops)
    if isinstance(filter_value, (dict, list, tuple)):
        return lambda v: _compare(v, filter_value)
    return lambda v: bool(v == filter_value)


def _compare(item_value: Any, filter_value: Any) -> bool:
    if isinstance(filter_value, dict):
        if any(k.startswith("$") for k in filter_value):
            return all(_operator(item_value, k, v) for k, v in filter_value.items())
        if not isinstance(item_value, dict):
            return False
        return all(_compare(item_value.get(k), v) for k, v in filter_value.items())
    if isinstance(filter_value, (list, tuple)):
        return (isinstance(item_value, (list, tuple)) and len(item_value) == len(filter_value)
                and all(_compare(i, f) for i, f in zip(item_value, filter_value)))  # fmt: skip
    return bool(item_value == filter_value)


_ORDER = {"$gt": float.__gt__, "$gte": float.__ge__, "$lt": float.__lt__, "$lte": float.__le__}


def _operator(value: Any, operator: str, operand: Any) -> bool:
    if operator == "$eq":
        return bool(value == operand)
    if operator == "$ne":
        return bool(value != operand)
    compare = _ORDER.get(operator)
    if compare is None:
        raise ValueError(f"Unsupported operator: {operator}")
    try:
        return bool(compare(float(value), float(operand)))
    except (TypeError, ValueError):  # a missing or non-numeric field: no match
        return False


def does_match(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    """Whether ``namespace`` meets a ``list_namespaces`` match condition (``prefix`` or
    ``suffix``, ``*`` matching any label).

    Raises:
        ValueError: another match type.
    """
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    pairs = (zip(namespace, path) if condition.match_type == "prefix"
             else zip(reversed(namespace), reversed(path)) if condition.match_type == "suffix"
             else None)  # fmt: skip
    if pairs is None:
        raise ValueError(f"Unsupported match type: {condition.match_type}")
    return all(p == "*" or n == p for n, p in pairs)
