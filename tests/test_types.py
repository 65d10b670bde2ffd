"""The public dataclasses of ``fastmem.types`` write their ``__init__`` out (compiled once into
the bytecode cache, where ``@dataclass`` compiles the methods it makes at every import): each
must still be the dataclass ``@dataclass(frozen=True)`` makes from its fields, in signature,
defaults, repr, equality, hash, frozenness, ``fields``/``asdict``/``replace``, slots and
pickling. Each is compared with that twin, made here by ``dataclasses.make_dataclass``.
"""

from __future__ import annotations

import dataclasses
import inspect
import pickle
from typing import Any

import pytest

import fastmem
from fastmem.types import (
    BackupReport, CompactReport, Context, ContextItem, ContextPolicy, EvictionPolicy, Hit,
    RecordInfo, RepairReport, Report, StoreStats,
)  # fmt: skip

PUBLIC = [Hit, Report, ContextPolicy, ContextItem, Context, EvictionPolicy, CompactReport,
          RepairReport, BackupReport, StoreStats, RecordInfo]  # fmt: skip


def twin(cls: type) -> type:
    """The class ``@dataclass(frozen=True)`` makes from ``cls``'s fields (with slots when
    ``cls`` has them, and its ``__post_init__``)."""
    spec = [(f.name, f.type, dataclasses.field(default=f.default, default_factory=f.default_factory))
            for f in dataclasses.fields(cls)]  # fmt: skip
    namespace = {"__post_init__": cls.__post_init__} if hasattr(cls, "__post_init__") else {}
    return dataclasses.make_dataclass(cls.__name__, spec, frozen=True, namespace=namespace,
                                      slots="__slots__" in cls.__dict__)  # fmt: skip


def values(cls: type) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two sets of valid field values differing in every field (ContextPolicy checks its)."""
    if cls is ContextPolicy:
        one, other = {}, {}
        for f in dataclasses.fields(cls):
            other[f.name] = f.default
            if isinstance(f.default, bool):
                one[f.name] = not f.default
            elif isinstance(f.default, int):
                one[f.name] = f.default + 1
            elif isinstance(f.default, float):
                one[f.name] = f.default / 2
            else:
                one[f.name] = 5.0  # recent_minutes: None by default
        return one, other
    names = [f.name for f in dataclasses.fields(cls)]
    return {n: f"{n}-one" for n in names}, {n: f"{n}-other" for n in names}


@pytest.mark.parametrize("cls", PUBLIC, ids=lambda c: c.__name__)
def test_each_public_dataclass_is_the_one_dataclass_makes(cls):
    made = twin(cls)
    assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen
    assert [(f.name, f.type, f.default, f.default_factory) for f in dataclasses.fields(cls)] == [
        (f.name, f.type, f.default, f.default_factory) for f in dataclasses.fields(made)]  # fmt: skip
    ours, theirs = inspect.signature(cls).parameters, inspect.signature(made).parameters
    assert [str(p) for p in ours.values()] == [str(p) for p in theirs.values()]
    assert cls.__match_args__ == made.__match_args__
    assert getattr(cls, "__slots__", None) == getattr(made, "__slots__", None)

    one, other = values(cls)
    a, b = cls(**one), made(**one)
    assert repr(a) == repr(b)
    assert hash(a) == hash(b)
    assert dataclasses.asdict(a) == dataclasses.asdict(b)
    assert dataclasses.astuple(a) == dataclasses.astuple(b)
    assert a == cls(*one.values()) and not a != cls(**one)
    assert a != b and a.__eq__(b) is NotImplemented  # another class, as a dataclass's
    assert pickle.loads(pickle.dumps(a)) == a
    for name in one:
        changed = dataclasses.replace(a, **{name: other[name]})
        assert changed != a and getattr(changed, name) == other[name]
        with pytest.raises(dataclasses.FrozenInstanceError, match=f"cannot assign to field '{name}'"):
            setattr(a, name, other[name])
        with pytest.raises(dataclasses.FrozenInstanceError):
            delattr(a, name)
    if "__slots__" not in cls.__dict__:  # a frozen dataclass without slots takes no new field
        with pytest.raises(dataclasses.FrozenInstanceError):
            a.extra = 1

    required = {f.name: one[f.name] for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}  # fmt: skip
    assert repr(cls(**required)) == repr(made(**required))
    for f in dataclasses.fields(cls):
        if f.default_factory is not dataclasses.MISSING:  # a new one each time, as the twin's
            assert getattr(cls(**required), f.name) is not getattr(cls(**required), f.name)


def test_the_policy_still_checks_its_fields():
    with pytest.raises(fastmem.InvalidInputError, match="recent must be an int"):
        ContextPolicy(recent=-1)
    with pytest.raises(fastmem.InvalidInputError, match="pinned_share must be from 0 to 1"):
        dataclasses.replace(ContextPolicy(), pinned_share=1.5)
    assert Context.LEFT_OUT == 12 and "LEFT_OUT" not in {f.name for f in dataclasses.fields(Context)}
