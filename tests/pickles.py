"""What a pickle imports by reference: the modules a server must have to read it."""
from __future__ import annotations

import pickletools


def imported_modules(payload: bytes) -> set:
    """The modules a pickle imports by reference: its GLOBAL opcodes, and its STACK_GLOBAL ones with
    the two strings before them (memoized strings followed through the memo)."""
    found, pushed, memo = set(), [], {}
    for op, arg, _ in pickletools.genops(payload):
        if op.name == "GLOBAL":
            found.add(arg.split(" ")[0])
        elif op.name == "STACK_GLOBAL":
            found.add(pushed[-2])
        elif op.name == "MEMOIZE":
            memo[len(memo)] = pushed[-1] if pushed else None
        elif op.name in ("BINPUT", "LONG_BINPUT", "PUT"):
            memo[arg] = pushed[-1] if pushed else None
        elif op.name in ("BINGET", "LONG_BINGET", "GET"):
            pushed.append(memo.get(arg))
        elif isinstance(arg, str):
            pushed.append(arg)
        else:
            pushed.append(None)
    return {m for m in found if m}
