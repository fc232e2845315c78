"""`python -m benchmarks.router_tier --smoke` end to end: 2 emulated workers, one router, then 2
router processes behind HAProxy (TCP mode, a new connection per request, so a session's turns meet
both replicas), then one replica killed and restarted mid-run. The replicas share nothing but the
workers, and their follow-ups must stick as one router's do.

HAProxy is Debian's `haproxy` (`make test-tools` installs it): without it the test skips, or
fails under ``SMETRIC_REQUIRE_DEPLOY=1`` (what ``make test`` sets)."""

from __future__ import annotations

import os
import shutil
from collections import defaultdict
from pathlib import Path

import pytest

ENV_REQUIRE = "SMETRIC_REQUIRE_DEPLOY"


def require_haproxy() -> None:
    if shutil.which("haproxy") is None:
        reason = "haproxy not found (Debian: apt-get install -y haproxy; make test-tools does it)"
        if os.environ.get(ENV_REQUIRE) == "1":
            pytest.fail(f"{reason}; {ENV_REQUIRE}=1 makes this a failure")
        pytest.skip(reason)


def test_replicas_behind_haproxy_stick_as_one_router(tmp_path: Path) -> None:
    require_haproxy()
    from benchmarks.router_tier import SMOKE, STICKY, main

    phases = main(["--smoke", "--out-dir", str(tmp_path), "--work-dir", str(tmp_path / "work")])
    assert set(phases) == {"one", "tier", "restart"}
    for name in ("one", "tier"):
        p, s = phases[name], phases[name].summary()
        assert s["failed"] == 0 and s["answered"] == SMOKE.sessions * SMOKE.turns, (name, s)
        # every follow-up of a session ran where its first turn did, decided sticky
        where: dict[int, set[str]] = defaultdict(set)
        for r in p.reqs:
            where[r.session].add(r.worker)
        assert all(len(w) == 1 and "" not in w for w in where.values()), (name, dict(where))
        assert s["followups"] == SMOKE.sessions * (SMOKE.turns - 1)
        assert all(r.reason in STICKY for r in p.reqs if r.turn), (name, s["followup_reasons"])
        # first turns were balanced: stickiness is not everything on one worker
        assert len(set().union(*where.values())) == SMOKE.workers, (name, dict(where))
        assert 0 < s["cached_share"] < 1
    # through the balancer, both replicas decided (each took its share of the connections)
    per = phases["tier"].summary()["per_replica"]
    assert sorted(per) == ["r0", "r1"] and all(n >= 4 for n in per.values()), per

    restart = phases["restart"].summary()
    ev = restart["events"]
    assert ev["killed"] < ev["ready"], ev
    # HAProxy marks the replica down only if its new process answers later than two failed
    # checks (0.5 s apart); a fast restart comes back between them and is never seen down
    if "down" in ev:
        assert ev["killed"] < ev["down"] < ev["up"] and ev["ready"] < ev["up"], ev
    # what the kill cost: the requests it held failed, and each got through on its retry (HAProxy
    # redispatches new connections while the replica is down)
    assert restart["failed_after_retry"] == 0, restart
    assert restart["answered"] == SMOKE.restart_sessions * SMOKE.turns, restart
    # A follow-up that reaches another replica before the worker's KV events of its previous
    # turn do is placed as if evicted (no replica sees another's in-flight requests): the retry
    # of the killed request makes that race likely once here, so one such follow-up is allowed.
    moved = restart["followups"] - round(restart["same_worker_share"] * restart["followups"])
    assert moved <= 1, restart

    md = (tmp_path / "router_tier-smoke.md").read_text()
    assert "| 2 replicas behind HAProxy | " in md and "## A replica's restart" in md
    assert (tmp_path / "router_tier-smoke.png").stat().st_size > 1000


def test_missing_haproxy_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import router_tier

    monkeypatch.setattr(shutil, "which", lambda _name: None)
    with pytest.raises(SystemExit, match="apt-get install -y haproxy"):
        router_tier.main(["--smoke"])
