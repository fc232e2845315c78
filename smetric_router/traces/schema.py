"""One request of a trace, whatever file format it came from (Bailian, Mooncake, generated)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """A request as the simulator and the replay tools consume it.

    block_ids: the trace's content ids of the prompt's blocks of `block_size` tokens (equal ids =
        equal content at the same position in a prefix chain); the last block may be partial.
    session / turn: the session this request belongs to and its 0-based position in it (turn 0 =
        first request). Loaders infer them where the format does not carry them.
    trigger: "agent", "user" or "compaction" where known (generated traces), else None.
    """

    req_id: str
    arrival_s: float
    session: str
    parent: str | None
    turn: int
    input_len: int
    output_len: int
    block_ids: tuple[int, ...]
    block_size: int
    trigger: str | None = None
