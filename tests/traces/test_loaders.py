"""Loaders on small hand-made files: Bailian chains, Mooncake session inference, bad lines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from smetric_router.traces.loaders import (
    TraceError,
    detect_format,
    load_bailian,
    load_mooncake,
    load_trace,
)


def write(tmp_path: Path, rows: list[dict[str, Any]], name: str = "t.jsonl") -> Path:
    p = tmp_path / name
    p.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return p


def bailian(chat: int, parent: int, ts: float, n_blocks: int, **extra: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "chat_id": chat,
        "parent_chat_id": parent,
        "timestamp": ts,
        "input_length": n_blocks * 16 - 3,
        "output_length": 20,
        "type": "text",
        "hash_ids": list(range(chat * 100, chat * 100 + n_blocks)),
    }
    row.update(extra)
    return row


def test_bailian_sessions_follow_parent_chains(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        [
            bailian(1, -1, 0.0, 2),
            bailian(2, -1, 0.5, 1),
            bailian(3, 1, 1.0, 3, trigger="agent"),
            bailian(5, 3, 4.0, 4, trigger="user"),
            bailian(4, 2, 2.0, 2),  # out of order in the file: sorted by arrival
            bailian(6, 99, 5.0, 1),  # parent outside the file stands in for the root
        ],
    )
    reqs = load_bailian(p)
    assert [r.req_id for r in reqs] == ["1", "2", "3", "4", "5", "6"]
    by = {r.req_id: r for r in reqs}
    assert [(by[i].session, by[i].turn) for i in "123456"] == [
        ("1", 0),
        ("2", 0),
        ("1", 1),
        ("2", 1),
        ("1", 2),
        ("99", 1),
    ]
    assert by["3"].parent == "1" and by["1"].parent is None
    assert by["5"].trigger == "user" and by["1"].trigger is None
    assert by["5"].block_ids == (500, 501, 502, 503) and by["5"].input_len == 61
    assert by["5"].block_size == 16


def test_bailian_turn_field_is_one_based_in_the_file(tmp_path: Path) -> None:
    p = write(tmp_path, [bailian(1, -1, 0.0, 1, turn=1), bailian(2, 1, 1.0, 1, turn=2)])
    assert [r.turn for r in load_bailian(p)] == [0, 1]


def test_bailian_block_size_is_a_parameter(tmp_path: Path) -> None:
    row = bailian(1, -1, 0.0, 2)
    row["input_length"] = 100  # two blocks of 64
    reqs = load_trace(write(tmp_path, [row]), "bailian", block_size=64)
    assert reqs[0].block_size == 64
    with pytest.raises(TraceError, match=r"t\.jsonl:1: 2 hash_ids for input_length 100"):
        load_bailian(write(tmp_path, [row]), block_size=16)


def mooncake(ts_ms: int, ids: list[int]) -> dict[str, Any]:
    n = len(ids) * 512 - 7
    return {"timestamp": ts_ms, "input_length": n, "output_length": 9, "hash_ids": ids}


def test_mooncake_sessions_from_prefix_chains(tmp_path: Path) -> None:
    # Block 0 is the system prompt: three blocks follow it across the trace (fan-out 3).
    rows = [
        mooncake(0, [0, 1, 2]),  # A turn 0
        mooncake(1000, [0, 3]),  # B turn 0: shares only the system prompt
        mooncake(2000, [0, 1, 4, 5]),  # A turn 1: extends A's full block 1
        mooncake(2500, [0, 1, 4, 6, 7]),  # A turn 2: deepest shared block 4 (held by turn 1)
        mooncake(3000, [0, 3, 8]),  # B turn 1
        mooncake(4000, [0, 9]),  # C turn 0
        mooncake(4500, [10, 11]),  # D: nothing shared
        mooncake(5000, [10, 12]),  # D turn 1: block 10 is not a template (fan-out 2)
    ]
    reqs = load_mooncake(write(tmp_path, rows), template_fanout=3)
    assert [(r.session, r.turn, r.parent) for r in reqs] == [
        ("0", 0, None),
        ("1", 0, None),
        ("0", 1, "0"),
        ("0", 2, "2"),
        ("1", 1, "1"),
        ("5", 0, None),
        ("6", 0, None),
        ("6", 1, "6"),
    ]
    assert reqs[2].arrival_s == 2.0 and reqs[0].block_size == 512
    assert reqs[0].input_len == 3 * 512 - 7 and reqs[0].output_len == 9


def test_mooncake_a_multi_block_system_prompt_is_not_a_session(tmp_path: Path) -> None:
    # Template [0, 1]: block 1 has fan-out 3, so block 0 above it is template too.
    rows = [mooncake(0, [0, 1, 2]), mooncake(1, [0, 1, 3]), mooncake(2, [0, 1, 4, 5])]
    reqs = load_mooncake(write(tmp_path, rows), template_fanout=3)
    assert [r.turn for r in reqs] == [0, 0, 0]
    # With a higher threshold the shared [0, 1] counts as a conversation prefix.
    reqs = load_mooncake(write(tmp_path, rows), template_fanout=4)
    # The third request branches off the shared prefix; its parent is the latest holder.
    got = [(r.session, r.turn, r.parent) for r in reqs]
    assert got == [("0", 0, None), ("0", 1, "0"), ("0", 2, "1")]


def test_detect_format(tmp_path: Path) -> None:
    b = write(tmp_path, [bailian(1, -1, 0.0, 1)], "b.jsonl")
    m = write(tmp_path, [mooncake(0, [0])], "m.jsonl")
    assert detect_format(b) == "bailian" and detect_format(m) == "mooncake"
    assert load_trace(m)[0].block_size == 512
    assert load_trace(b)[0].req_id == "1"
    with pytest.raises(TraceError, match="unknown trace format"):
        detect_format(write(tmp_path, [{"x": 1}], "x.jsonl"))


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "expected a JSON object"),
        (b'{"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": ["a"]}', "hash_ids"),
        (b'{"timestamp": -1, "input_length": 5, "output_length": 1, "hash_ids": [1]}', "timestamp"),
        (b'{"timestamp": 1, "input_length": 5.5, "output_length": 1, "hash_ids": [1]}', "input_"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path: Path, line: bytes, reason: str) -> None:
    good = orjson.dumps(mooncake(0, [0, 1]))
    p = tmp_path / "bad.jsonl"
    p.write_bytes(good + b"\n\n" + line + b"\n")
    with pytest.raises(TraceError, match=reason) as info:
        load_mooncake(p)
    assert info.value.line == 3 and str(info.value).startswith(f"{p}:3: ")


def test_bailian_duplicate_and_bad_trigger(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r":2: duplicate chat_id 1"):
        load_bailian(write(tmp_path, [bailian(1, -1, 0.0, 1), bailian(1, -1, 1.0, 1)]))
    with pytest.raises(TraceError, match=r":1: field 'trigger'"):
        load_bailian(write(tmp_path, [bailian(1, -1, 0.0, 1, trigger="robot")]))


def test_cli_reports_a_bad_line_and_exits_2(tmp_path: Path) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_bytes(orjson.dumps(mooncake(0, [0])) + b"\n{oops\n")
    proc = subprocess.run(
        [sys.executable, "-m", "smetric_router.traces", "load", str(p)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert f"{p}:2: not valid JSON" in proc.stderr and "Traceback" not in proc.stderr


def test_missing_file_is_a_trace_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read"):
        load_trace(tmp_path / "nope.jsonl", "bailian")
