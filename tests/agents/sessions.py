"""What a whole agent run through the router must show (shared by the agents' tests)."""

from __future__ import annotations

from tests.agents.recorder import Exchange, Recorder
from tests.helpers.prometheus import total


def assert_served(recorder: Recorder, path: str) -> list[Exchange]:
    """Every generation request on `path` answered 200 with its decision; returns them."""
    seen = recorder.generation(path)
    posts = [e for e in seen if e.method == "POST" and not e.path.endswith("count_tokens")]
    assert posts, f"no request reached {path}: {[(e.method, e.path) for e in recorder.exchanges]}"
    for e in posts:
        assert e.status == 200, (e.path, e.status, e.body)
        assert e.worker and e.reason, e
    return posts


def assert_sticky_with_history(posts: list[Exchange], page: int) -> list[Exchange]:
    """At least one follow-up stuck to its worker with its history served from cache (all of
    the previous request's full pages, or more). Returns the sticky ones."""
    sticky = [e for e in posts if e.reason == "sticky"]
    assert sticky, [(e.reason, e.prompt_tokens, e.cached_tokens) for e in posts]
    hits = [e for e in sticky if (e.cached_tokens or 0) >= page]
    assert hits, [(e.reason, e.prompt_tokens, e.cached_tokens) for e in posts]
    for e in hits:
        earlier = [p for p in posts[: posts.index(e)] if p.worker == e.worker and p.prompt_tokens]
        assert earlier, e
        assert (e.cached_tokens or 0) >= min(p.prompt_tokens or 0 for p in earlier) // page * page
    return sticky


def assert_metrics_say_so(before: str, after: str, endpoint: str) -> None:
    """The router's own per-endpoint counts grew by a balanced first request and a sticky one."""
    name = "smetric_endpoint_decisions_total"
    for reason in ("first-turn-balance", "sticky"):
        grew = total(after, name, endpoint=endpoint, reason=reason)
        assert grew > total(before, name, endpoint=endpoint, reason=reason), reason
