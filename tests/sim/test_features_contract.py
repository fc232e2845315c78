"""The simulator feeds a policy what the router would compute from the request itself (est_hit
and turn from the history the request carries), never what the replay has seen of its session
(sim/NOTES.md, "What a policy is fed")."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from smetric_router.core.types import RequestFeatures
from smetric_router.sim.cluster import router_features
from smetric_router.traces.generate import GenConfig, generate
from smetric_router.traces.loaders import carried_history, load_bailian, with_carried_history
from smetric_router.traces.schema import TraceRequest

CFG = GenConfig(sessions=40, seed=3, instances=4)
Key = tuple[float, int, int]


def _features(req: TraceRequest) -> RequestFeatures:
    return router_features(req, [], CFG.block_size)


def _by_request(path: Path, lead_in_s: float) -> dict[Key, TraceRequest]:
    """A file's requests by (arrival in window time, input, output)."""
    return {(round(r.arrival_s - lead_in_s, 3), r.input_len, r.output_len): r
            for r in load_bailian(path, CFG.block_size)}  # fmt: skip


Files = tuple[dict[Key, TraceRequest], ...]


@pytest.fixture(scope="module")
def window_and_whole(tmp_path_factory: pytest.TempPathFactory) -> Files:
    """One seed written twice: the window alone, and with its whole warm-up before it."""
    tmp = tmp_path_factory.mktemp("contract")
    generate(CFG, tmp / "window.jsonl")
    generate(replace(CFG, lead_in_s=CFG.warmup_s), tmp / "whole.jsonl")
    return _by_request(tmp / "window.jsonl", 0.0), _by_request(tmp / "whole.jsonl", CFG.warmup_s)


def test_a_session_begun_before_the_window_carries_its_history_into_it(
    window_and_whole: Files,
) -> None:
    window, whole = window_and_whole
    ids = {r.req_id for r in window.values()}
    cut = [k for k, r in window.items() if r.parent is not None and r.parent not in ids]
    assert len(cut) > 10
    for key in cut:
        req, seen_whole = window[key], whole[key]
        parent = next(p for p in whole.values() if p.req_id == seen_whole.parent)
        f = _features(req)
        if req.trigger == "compaction":  # system prompt + summary: a new conversation
            assert (f.est_hit, f.turn) == (0, 0)
            continue
        # the parent's prompt and reply, which the request re-sends, whether or not the parent
        # is in the file
        assert f.est_hit == parent.input_len + parent.output_len > 0, key
        assert f.turn == parent.router_turn + 1


def test_features_do_not_depend_on_what_the_replay_has_seen(
    window_and_whole: Files,
) -> None:
    window, whole = window_and_whole
    assert set(window) <= set(whole)
    for key, req in window.items():
        a, b = _features(req), _features(whole[key])
        assert (a.est_hit, a.turn) == (b.est_hit, b.turn), key


def test_what_the_generator_writes_is_what_the_parent_in_the_file_gives(
    window_and_whole: Files,
) -> None:
    _, whole = window_and_whole
    by_id = {r.req_id: r for r in whole.values()}
    kinds = {"agent": 0, "user": 0, "compaction": 0, "fork": 0}
    for r in whole.values():
        assert 0 <= r.history_len <= r.input_len and r.history_turns is not None
        if r.parent in by_id and r.trigger != "compaction":
            derived = carried_history(r.block_ids, r.input_len, by_id[r.parent])
            assert r.history_len == derived, r
            assert r.history_turns == by_id[r.parent].router_turn + 1
            kinds[str(r.trigger)] += 1
        elif r.trigger == "compaction":
            assert (r.history_len, r.history_turns) == (0, 0)
            kinds["compaction"] += 1
        elif r.parent is None and r.turn > 0:  # a sub-agent: replies in its share of the parent
            assert r.history_len < r.input_len and (r.history_len > 0) == (r.history_turns > 0)
            kinds["fork"] += r.history_turns > 0  # (a share cut before the first reply has none)
        else:  # a session's first request
            assert (r.history_len, r.history_turns) == (0, 0)
    assert all(kinds.values()), kinds


def test_a_hand_built_trace_gets_its_history_from_its_parents() -> None:
    def req(rid: str, parent: str | None, blocks: tuple[int, ...], out: int = 7) -> TraceRequest:
        return TraceRequest(rid, 0.0, "s", parent, 0 if parent is None else 1,
                            len(blocks) * 16 + 3, out, blocks, 16)  # fmt: skip

    a = req("a", None, (1, 2, 3))
    b = req("b", "a", (1, 2, 3, 4, 5))  # extends a: a's prompt and reply
    c = req("c", "a", (1, 2, 9))  # branches off a after two blocks
    d = req("d", "gone", (1, 2))  # its parent is not in the list: nothing to know
    got = {r.req_id: r.history_len for r in with_carried_history([a, b, c, d])}
    assert got == {"a": 0, "b": a.input_len + a.output_len, "c": 32, "d": 0}
