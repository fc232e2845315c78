"""Exercise the patch's read-only tier walk on a hand-built tree, without torch.

Usage: python patches/check_walk.py PATCHED_SITE_DIR

SGLang's tree modules import torch at module level, so this loads only the two
pieces the walk needs from the patched sources (RadixKey from radix_cache.py and
UnifiedTreeCore.match_prefix_tiers) and runs them over stand-in nodes that carry
the attributes the walk reads (children, key, evicted, backuped).
"""

from __future__ import annotations
import __future__

import ast
import sys
import typing
from array import array
from pathlib import Path
from typing import Any


def _load(path: Path, kind: type[ast.AST], name: str) -> ast.AST:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, kind) and getattr(node, "name", None) == name:
            return node
    raise SystemExit(f"{name} not found in {path}")


def _namespace(site: Path) -> dict[str, Any]:
    srt = site / "sglang" / "srt" / "mem_cache"
    radix_key = _load(srt / "radix_cache.py", ast.ClassDef, "RadixKey")
    walk = _load(
        srt / "unified_cache" / "unified_tree_core.py",
        ast.FunctionDef,
        "match_prefix_tiers",
    )
    ns: dict[str, Any] = {"array": array, **vars(typing)}
    flags = __future__.annotations.compiler_flag
    module = ast.Module(body=[radix_key, walk], type_ignores=[])  # type: ignore[list-item]
    exec(compile(module, "patched-sglang", "exec", flags=flags, dont_inherit=True), ns)
    return ns


class Node:
    def __init__(self, tokens: list[int], *, device: bool, host: bool, key_cls: Any):
        self.key = key_cls(array("q", tokens))
        self.children: dict[Any, Node] = {}
        self.evicted = not device
        self.backuped = host
        self.last_access_time = 0.0

    def add(self, child: Node, page_size: int) -> Node:
        self.children[child.key.child_key(page_size)] = child
        return child


class Tree:
    """Stands in for UnifiedTreeCore: the attributes match_prefix_tiers reads."""

    def __init__(self, ns: dict[str, Any], page_size: int) -> None:
        self.page_size = page_size
        self.is_eagle = False
        self.root_node = Node([], device=True, host=False, key_cls=ns["RadixKey"])
        self._walk = ns["match_prefix_tiers"]

    def tiers(self, key_cls: Any, tokens: list[int]) -> tuple[int, int | None]:
        result: tuple[int, int | None] = self._walk(self, key_cls(array("q", tokens)))
        return result


def main() -> None:
    ns = _namespace(Path(sys.argv[1]))
    key_cls, page = ns["RadixKey"], 2
    tree = Tree(ns, page)

    def node(tokens: list[int], device: bool, host: bool) -> Node:
        return Node(tokens, device=device, host=host, key_cls=key_cls)

    a = tree.root_node.add(node([1, 2, 3, 4], True, True), page)
    b = a.add(node([5, 6, 7, 8], False, True), page)  # host only
    b.add(node([9, 10], True, True), page)  # on device again below a host node
    a.add(node([20, 21], False, False), page)  # dead: evicted, not backed up
    nodes = [a, b, *b.children.values(), *a.children.values()]
    before = [(n.key.token_ids.tolist(), len(n.children)) for n in nodes]

    cases = {
        "device then host": ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], (4, 10)),
        "ends inside a node": ([1, 2, 3, 5], (2, 2)),
        "page aligned": ([1, 2, 3], (2, 2)),
        "dead node stops": ([1, 2, 3, 4, 20, 21], (4, 4)),
        "host part only": ([1, 2, 3, 4, 5, 6], (4, 6)),
        "miss": ([7, 7, 7, 7], (0, 0)),
        "empty": ([], (0, 0)),
    }
    failed = 0
    for name, (tokens, want) in cases.items():
        got = tree.tiers(key_cls, tokens)
        failed += got != want
        print(f"{'ok  ' if got == want else 'FAIL'} {name}: {tokens} -> {got} (want {want})")
    after = [(n.key.token_ids.tolist(), len(n.children)) for n in nodes]
    touched = any(n.last_access_time != 0.0 for n in nodes)
    print(f"{'ok  ' if before == after else 'FAIL'} no node split")
    print(f"{'ok  ' if not touched else 'FAIL'} no access-time touch")
    failed += (before != after) + touched
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
