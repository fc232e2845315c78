"""PageMapper: pages reused from a session's previous request equal freshly hashed ones."""

from __future__ import annotations

import pytest

from smetric_router.sim import pages as pages_mod
from smetric_router.sim.pages import PageMapper
from smetric_router.traces.schema import TraceRequest

PS, BS = 4, 8  # two pages per block


def req(session: str, ids: tuple[int, ...], input_len: int, output_len: int = 5) -> TraceRequest:
    return TraceRequest("r", 0.0, session, None, 0, input_len, output_len, ids, BS)


def fresh(r: TraceRequest, serial: int) -> list[int]:
    return PageMapper(PS).pages(r, serial)


def test_follow_ups_reuse_pages_exactly() -> None:
    seqs = [
        req("s", (1, 2, 3), 22),  # last block partial: its second page is request-private
        req("s", (1, 2, 3, 4), 32),  # shares blocks 1, 2 whole; 3 was partial before
        req("s", (1, 2, 9, 4), 30),  # diverges at the third block
        req("s", (1,), 3),  # shorter than one page of its block
        req("t", (1, 2, 3, 4), 40),  # other session, prompt longer than its blocks
        req("s", (1, 2, 9, 4, 5), 40),
    ]
    mapper = PageMapper(PS)
    for n, r in enumerate(seqs):
        assert mapper.pages(r, n) == fresh(r, n)
    shared = fresh(seqs[1], 1)[:4]
    assert fresh(seqs[2], 2)[:4] == shared and fresh(seqs[2], 2)[4] != fresh(seqs[1], 1)[4]


def test_sessions_beyond_the_bound_are_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pages_mod, "_SESSIONS_KEPT", 2)
    mapper = PageMapper(PS)
    for n, s in enumerate("abc"):
        mapper.pages(req(s, (1, 2), 16), n)
    assert list(mapper._last) == ["b", "c"]
    r = req("a", (1, 2, 3), 24)
    assert mapper.pages(r, 9) == fresh(r, 9)
