"""What a compile or a walk works out once per object it is given, kept by that object's identity.

A sweep's points share the objects the sweep leaves alone (a site, a metric's definition, a
tokenizer, a prompt set), and hashing one by value would cost what the memo saves (a definition
hashes by dumping itself to JSON). ``kept`` keys on ``id`` and keeps the object beside its value,
so the id cannot be reused by another object while the entry lives.
"""
from __future__ import annotations

from typing import Any, Callable, TypeVar

T = TypeVar("T")


def kept(store: dict, obj: Any, make: Callable[[], T], *key: Any) -> T:
    """``store``'s value for ``obj`` (and ``key``), made by ``make()`` first when it has none; a
    ``make`` that raises stores nothing, so a refusal is made afresh by whoever asks next."""
    slot = (id(obj), *key)
    known = store.get(slot)
    if known is None or known[0] is not obj:
        known = store[slot] = (obj, make())
    return known[1]
