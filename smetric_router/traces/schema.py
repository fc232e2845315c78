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
    history_len / history_turns: what the router reads off the request itself: the leading prompt
        tokens of the history it carries, through its last assistant message (est_hit), and that
        history's assistant messages (the router's turn; None: `turn`). A follow-up whose earlier
        turns fell before the trace's window carries them all the same.
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
    history_len: int = 0
    history_turns: int | None = None

    @property
    def router_turn(self) -> int:
        """The turn the router infers from the request (assistant messages it carries)."""
        return self.turn if self.history_turns is None else self.history_turns
