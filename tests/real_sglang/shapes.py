"""Shape of a JSON-like tree as a set of `path: type` lines, and the differences of two shapes.

Values are replaced by their type (`int`, `float`, `str`, `bool`, `null`), except `Exact` ones,
which count as their value, and the discriminators clients branch on: every `object` string
("chat.completion.chunk", "error", ...) and an error object's `type` and `code`. Lists fold
their elements into one path segment `[]`; a list element that is an object tagged by a string
`type` (KV events) folds into `[type=X]` instead, so each event kind keeps its own key set. A
path holding several types (a null finish_reason in early stream chunks, an object in the last)
lists each.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any

from tests.real_sglang.shape_probes import Exact

_TYPES = {bool: "bool", int: "int", float: "float", str: "str", type(None): "null"}


def shape(tree: Any, path: str = "") -> set[str]:
    out: set[str] = set()
    if isinstance(tree, Exact):
        out.add(f"{path} = {tree.value}")
    elif isinstance(tree, dict):
        out.add(f"{path}: object")
        error = tree.get("object") == "error"
        for key, value in tree.items():
            sub = f"{path}.{key}" if path else key
            exact = (key == "object" and isinstance(value, str)) or (
                error and key in ("type", "code")
            )
            if exact:
                out.add(f"{sub} = {value}")
            else:
                out |= shape(value, sub)
    elif isinstance(tree, list):
        out.add(f"{path}: list")
        for item in tree:
            tag = item.get("type") if isinstance(item, dict) else None
            out |= shape(item, f"{path}[type={tag}]" if isinstance(tag, str) else f"{path}[]")
    else:
        out.add(f"{path}: {_TYPES.get(type(tree), type(tree).__name__)}")
    return out


@dataclass(frozen=True, slots=True)
class Allowed:
    """A known difference: lines (fnmatch patterns) only the real worker or only the emulator
    has, with the reason it is accepted."""

    pattern: str
    side: str  # "real": the line is only in real SGLang; "emulator": only in the emulator
    reason: str


def differences(real: Any, emulated: Any, allowed: tuple[Allowed, ...]) -> list[str]:
    """Shape lines that differ and no Allowed entry covers, each prefixed by the side having it."""
    a, b = shape(real), shape(emulated)
    out = []
    for side, lines in (("real", a - b), ("emulator", b - a)):
        for line in sorted(lines):
            if not any(al.side == side and fnmatch.fnmatchcase(line, al.pattern) for al in allowed):
                out.append(f"only {side}: {line}")
    return out


def unused(
    real: Any, emulated: Any, allowed: tuple[Allowed, ...]
) -> list[Allowed]:  # fmt: skip
    """Allowed entries no difference needs any more (stale exceptions)."""
    a, b = shape(real), shape(emulated)
    only = {"real": a - b, "emulator": b - a}
    return [
        al for al in allowed
        if not any(fnmatch.fnmatchcase(line, al.pattern) for line in only[al.side])
    ]  # fmt: skip
