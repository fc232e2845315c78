"""Trace file loaders: the public Bailian schema and the Mooncake schema, into `TraceRequest`s.

Bailian (`chat_id, parent_chat_id, timestamp` in s, `input_length, output_length, type, turn,
hash_ids`; generated traces add `trigger`): a session is a chain of requests linked by
`parent_chat_id` (-1, null or absent = a root); the root's `chat_id` is the session id. A parent
missing from the file (a trace cut out of a longer window) stands in for the root. The turn comes
from the `turn` field when present (1-based in the public trace: the file's smallest turn is taken
as turn 0), else from the chain depth. What the router reads off each request (TraceRequest's
history_len / history_turns) comes from `history_length` / `history_turns` where the file has them
(generated traces), else from the parent in the file (see `carried_history`; a follow-up whose
parent is missing from the file then carries none that the simulator can know of).

Mooncake (`timestamp` in ms, `input_length, output_length`, `hash_ids` of 512-token blocks, no
session fields): hash ids are prefix-chained (an id names a block together with everything before
it), so the requests form a prefix tree. Sessions are inferred from it:

- a *template* node is a block after which at least `template_fanout` distinct blocks follow
  somewhere in the trace (a system prompt shared by many conversations), and so is every block
  above one;
- a request continues a session when the deepest block it shares with any earlier request is not a
  template node, i.e. it shares more than the common system prompt. Its parent is the latest earlier
  request holding that block and its turn is the parent's plus one;
- otherwise it starts a new session (turn 0) whose id is its own request id.

What the router reads off a request is derived from its parent (`carried_history`).

A conversation re-sends its history, so turn k+1 shares all of turn k's full blocks; sibling
branches of one conversation (retries, parallel calls) stay far below the default fan-out of 32,
while the conversation trace's one system-prompt block is followed by thousands of others.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import orjson

from smetric_router.traces.schema import TraceRequest

Format = Literal["bailian", "mooncake"]
FORMATS: tuple[Format, ...] = ("bailian", "mooncake")
MOONCAKE_BLOCK_SIZE = 512
TRIGGERS = ("agent", "user", "compaction")


class TraceError(ValueError):
    """An unreadable trace; the message names the file and, for a bad line, its number."""

    def __init__(self, path: str | Path, line: int | None, reason: str) -> None:
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {reason}")
        self.path = str(path)
        self.line = line
        self.reason = reason


def _records(path: str | Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise TraceError(path, None, f"cannot read: {exc.strerror or exc}") from exc
    out: list[tuple[int, dict[str, Any]]] = []
    for no, raw in enumerate(data.splitlines(), start=1):
        if not raw.strip():
            continue
        out.append((no, _parse_line(path, no, raw)))
    if not out:
        raise TraceError(path, None, "no requests in the file")
    return out


def _int(path: str | Path, no: int, obj: dict[str, Any], key: str, minimum: int = 0) -> int:
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, int):
        raise TraceError(path, no, f"field {key!r} must be an integer, got {v!r}")
    if v < minimum:
        raise TraceError(path, no, f"field {key!r} must be >= {minimum}, got {v}")
    return v


def _number(path: str | Path, no: int, obj: dict[str, Any], key: str) -> float:
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float) or v != v or v < 0:
        raise TraceError(path, no, f"field {key!r} must be a non-negative number, got {v!r}")
    return float(v)


def _hash_ids(path: str | Path, no: int, obj: dict[str, Any]) -> tuple[int, ...]:
    v = obj.get("hash_ids")
    if not isinstance(v, list) or not all(
        isinstance(x, int) and not isinstance(x, bool) for x in v
    ):
        raise TraceError(path, no, "field 'hash_ids' must be a list of integers")
    return tuple(v)


def _check_blocks(
    path: str | Path, no: int, ids: tuple[int, ...], input_len: int, block_size: int
) -> None:
    need = -(-input_len // block_size)
    if len(ids) != need:
        raise TraceError(
            path,
            no,
            f"{len(ids)} hash_ids for input_length {input_len} "
            f"(expected {need} blocks of {block_size} tokens)",
        )


def carried_history(ids: tuple[int, ...], input_len: int, parent: TraceRequest | None) -> int:
    """A request's est_hit as the router computes it (its prompt through the last assistant
    reply), from the parent in the file: a conversation re-sends its parent's prompt and reply, so
    a request that extends all of its parent's full blocks carries both; one that branches off
    (a sub-agent, a compaction) carries the blocks it shares with it."""
    if parent is None:
        return 0
    shared = 0
    for a, b in zip(parent.block_ids, ids, strict=False):
        if a != b:
            break
        shared += 1
    if shared >= parent.input_len // parent.block_size:
        return min(parent.input_len + parent.output_len, input_len)
    return shared * parent.block_size


def with_carried_history(reqs: Sequence[TraceRequest]) -> list[TraceRequest]:
    """`reqs` with each request's est_hit derived from its parent among them (carried_history),
    for traces built in memory; requests that say theirs already keep it."""
    by_id = {r.req_id: r for r in reqs}
    return [
        r
        if r.history_len or r.parent not in by_id
        else replace(r, history_len=carried_history(r.block_ids, r.input_len, by_id[r.parent]))
        for r in reqs
    ]


def _by_arrival(rows: list[tuple[float, int, dict[str, Any]]]) -> None:
    # Stable: equal timestamps keep file order, so a parent logged first stays first.
    rows.sort(key=lambda r: r[0])


def load_bailian(path: str | Path, block_size: int = 16) -> list[TraceRequest]:
    """Requests of a Bailian-schema JSONL file in arrival order; see the module docstring."""
    rows: list[tuple[float, int, dict[str, Any]]] = []
    for no, obj in _records(path):
        rows.append((_number(path, no, obj, "timestamp"), no, obj))
    _by_arrival(rows)
    turns = [r[2]["turn"] for r in rows if "turn" in r[2]]
    turn_base = min(t for t in turns if isinstance(t, int)) if turns else 0
    session_of: dict[str, str] = {}
    depth_of: dict[str, int] = {}
    by_id: dict[str, TraceRequest] = {}
    out: list[TraceRequest] = []
    for ts, no, obj in rows:
        chat = obj.get("chat_id")
        if isinstance(chat, bool) or not isinstance(chat, int | str):
            raise TraceError(path, no, f"field 'chat_id' must be an int or string, got {chat!r}")
        req_id = str(chat)
        if req_id in session_of:
            raise TraceError(path, no, f"duplicate chat_id {req_id}")
        raw_parent = obj.get("parent_chat_id", -1)
        if isinstance(raw_parent, bool) or not isinstance(raw_parent, int | str | None):
            raise TraceError(path, no, f"field 'parent_chat_id' is not an id: {raw_parent!r}")
        parent = None if raw_parent in (-1, None, "", "-1") else str(raw_parent)
        if parent is None:
            session, depth = req_id, 0
        elif parent in session_of:
            session, depth = session_of[parent], depth_of[parent] + 1
        else:
            session, depth = parent, 1
        if "turn" in obj:
            turn = _int(path, no, obj, "turn", minimum=turn_base) - turn_base
        else:
            turn = depth
        session_of[req_id], depth_of[req_id] = session, depth
        input_len = _int(path, no, obj, "input_length")
        ids = _hash_ids(path, no, obj)
        _check_blocks(path, no, ids, input_len, block_size)
        trigger = obj.get("trigger")
        if trigger is not None and trigger not in TRIGGERS:
            raise TraceError(path, no, f"field 'trigger' must be in {TRIGGERS}, got {trigger!r}")
        history_turns = None
        if "history_length" in obj:
            history = _int(path, no, obj, "history_length")
            if history > input_len:
                raise TraceError(path, no, f"history_length {history} > input_length {input_len}")
            history_turns = _int(path, no, obj, "history_turns")
        else:
            history = carried_history(ids, input_len, by_id.get(parent or ""))
        req = TraceRequest(
            req_id=req_id,
            arrival_s=ts,
            session=session,
            parent=parent,
            turn=turn,
            input_len=input_len,
            output_len=_int(path, no, obj, "output_length"),
            block_ids=ids,
            block_size=block_size,
            trigger=trigger,
            history_len=history,
            history_turns=history_turns,
        )
        by_id[req_id] = req
        out.append(req)
    return out


def load_mooncake(path: str | Path, template_fanout: int = 32) -> list[TraceRequest]:
    """Requests of a Mooncake-schema JSONL file in arrival order, sessions inferred from the
    prefix tree of `hash_ids` (see the module docstring for the rule)."""
    if template_fanout < 2:
        raise ValueError("template_fanout must be >= 2")
    rows: list[tuple[float, int, dict[str, Any]]] = []
    parsed: dict[int, tuple[int, int, tuple[int, ...]]] = {}
    for no, obj in _records(path):
        ts = _number(path, no, obj, "timestamp") / 1000.0
        input_len = _int(path, no, obj, "input_length")
        ids = _hash_ids(path, no, obj)
        _check_blocks(path, no, ids, input_len, MOONCAKE_BLOCK_SIZE)
        parsed[no] = (input_len, _int(path, no, obj, "output_length"), ids)
        rows.append((ts, no, obj))
    _by_arrival(rows)

    # Prefix tree: each id's block before it (first sighting), and how many ids follow each.
    before: dict[int, int] = {}
    for _, _, ids in parsed.values():
        prev = -1
        for x in ids:
            before.setdefault(x, prev)
            prev = x
    fanout = Counter(before.values())
    template: set[int] = set()
    for node, n in fanout.items():
        while n >= template_fanout and node != -1 and node not in template:
            template.add(node)
            node = before.get(node, -1)

    holder: dict[int, int] = {}  # block id -> index of the latest request holding it
    out: list[TraceRequest] = []
    for i, (ts, no, _) in enumerate(rows):
        input_len, output_len, ids = parsed[no]
        shared = 0
        while shared < len(ids) and ids[shared] in holder:
            shared += 1
        req_id = str(i)
        if shared and ids[shared - 1] not in template:
            p = out[holder[ids[shared - 1]]]
            session, parent, turn = p.session, p.req_id, p.turn + 1
        else:
            session, parent, turn = req_id, None, 0
        for x in ids:
            holder[x] = i
        out.append(
            TraceRequest(
                req_id=req_id,
                arrival_s=ts,
                session=session,
                parent=parent,
                turn=turn,
                input_len=input_len,
                output_len=output_len,
                block_ids=ids,
                block_size=MOONCAKE_BLOCK_SIZE,
                history_len=carried_history(ids, input_len, out[int(parent)] if parent else None),
            )
        )
    return out


def detect_format(path: str | Path) -> Format:
    """ "bailian" when the first request has a `chat_id`, "mooncake" when it has only `hash_ids`."""
    no, obj = _first_record(path)
    if "chat_id" in obj:
        return "bailian"
    if "hash_ids" in obj and "timestamp" in obj:
        return "mooncake"
    raise TraceError(path, no, "unknown trace format (no chat_id or hash_ids/timestamp fields)")


def _parse_line(path: str | Path, no: int, raw: bytes) -> dict[str, Any]:
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise TraceError(path, no, f"not valid JSON ({exc})") from exc
    if not isinstance(obj, dict):
        raise TraceError(path, no, "expected a JSON object")
    return obj


def _first_record(path: str | Path) -> tuple[int, dict[str, Any]]:
    try:
        with Path(path).open("rb") as f:
            for no, raw in enumerate(f, start=1):
                if not raw.strip():
                    continue
                return no, _parse_line(path, no, raw)
    except OSError as exc:
        raise TraceError(path, None, f"cannot read: {exc.strerror or exc}") from exc
    raise TraceError(path, None, "no requests in the file")


def load_trace(
    path: str | Path, fmt: Format | Literal["auto"] = "auto", block_size: int = 16
) -> list[TraceRequest]:
    """Load a trace of either format; `block_size` applies to Bailian files (Mooncake's is 512)."""
    kind = detect_format(path) if fmt == "auto" else fmt
    if kind == "bailian":
        return load_bailian(path, block_size=block_size)
    if kind == "mooncake":
        return load_mooncake(path)
    raise ValueError(f"unknown trace format {fmt!r}")
