"""The KV-event recorder against a live worker: a fresh recording passes the same checks as the
committed one (tests/fixtures/kv_events), so the fixture can always be made again.

Runs tests/fixtures/kv_events/record.py (one real SGLang CPU worker through the launcher, ~2 min)
into a temporary folder. Eviction details depend on timing, so only the checks against the
worker's own answers are repeated here, not the committed recording's literal counts.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from tests.fixtures.kv_events import load
from tests.fixtures.kv_events.truths import Truths
from tests.sglang_env import REPO, require_sglang_python

pytestmark = pytest.mark.sglang


def test_a_fresh_recording_agrees_with_the_workers_own_answers(tmp_path: Path) -> None:
    require_sglang_python()
    proc = subprocess.run(
        [sys.executable, "-m", "tests.fixtures.kv_events.record", "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    rec = load(tmp_path)
    assert rec.metadata["sglang_version"] == "0.5.23"
    kinds = {(m.socket, m.replay) for m in rec.messages}
    assert kinds == {("replay", 0), ("sub", None), ("replay", 1)}
    truths = Truths(rec)
    pages = {name: (gpu, host) for name, gpu, host in truths.check_phases()}
    # each phase did what it is for: evictions to the host tier, then host evictions, then flush
    assert pages["device_evict"][0] < pages["device_evict"][1]
    assert pages["flush"] == (0, 0)
    removed_host = sum(
        1
        for m in rec.sub
        for ev in msgspec.msgpack.decode(m.payload)[1]
        if ev["type"] == "BlockRemoved" and ev.get("medium") == "CPU_PINNED"
    )
    assert removed_host > 0
    assert truths.check_cached_tokens() == 15
    answer = rec.replay(1)
    assert [m.seq for m in answer] == [*range(rec.phases[-1].last_seq + 1), -1]
