"""The soak benchmark's verdict rests on how it classifies answers, so that is tested here; and
the harness itself at its smallest size (2 workers, SIGKILL and restart, a few K requests)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.soak import _json_outcome, _stream_outcome, main
from smetric_router.router.errors import sse_error_event

CHUNK = b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n'
DONE = b"data: [DONE]\n\n"


@pytest.mark.parametrize(
    ("raw", "outcome"),
    [
        (CHUNK + CHUNK + DONE, "ok"),
        (CHUNK + b"\n\n" + sse_error_event("worker lost"), "failed_clean"),  # the router's close
        (CHUNK + CHUNK, "unclean"),  # cut without [DONE]
        (CHUNK + b'data: {"choi', "unclean"),  # cut mid-event
        (b"data: {not json}\n\n" + DONE, "unclean"),
        (b"", "unclean"),
    ],
)
def test_stream_outcomes(raw: bytes, outcome: str) -> None:
    assert _stream_outcome(raw, "chat-stream")[0] == outcome


def test_session_stream_reply_text_is_collected() -> None:
    assert _stream_outcome(CHUNK + CHUNK + DONE, "session-stream")[1] == "hihi"


@pytest.mark.parametrize(
    ("status", "body", "kind", "outcome"),
    [
        (200, {"choices": [{"message": {"content": "x"}}]}, "chat", "ok"),
        (200, {"text": "x", "meta_info": {}}, "generate", "ok"),
        (200, {"choices": []}, "chat", "unclean"),
        (503, {"error": {"message": "no worker", "type": "server_error"}}, "chat", "failed_clean"),
        (502, {"object": "error", "message": "x"}, "chat", "unclean"),  # not OpenAI's shape
    ],
)
def test_json_outcomes(status: int, body: object, kind: str, outcome: str) -> None:
    assert _json_outcome(status, json.dumps(body).encode(), kind)[0] == outcome


def test_json_outcome_of_a_body_that_does_not_parse() -> None:
    assert _json_outcome(502, b"<html>Bad Gateway</html>", "chat")[0] == "unclean"


def test_smallest_soak_with_a_worker_killed(tmp_path: Path) -> None:
    out = tmp_path / "soak"
    # RSS growth is not judged at this size (warm-up is most of the run): --max-growth 100
    # killed by progress, not the clock: a loaded machine still kills inside the run
    code = main(["--requests", "2500", "--workers", "2", "--kill-every-requests", "800",
                 "--sample-every", "500", "--max-growth", "100", "--out", str(out)])  # fmt: skip
    report = json.loads(out.with_suffix(".json").read_text())
    assert code == 0, out.with_suffix(".md").read_text()
    assert sum(report["outcomes"].values()) == 2500
    assert report["inflight_left"] == 0
    assert report["kills"] >= 1, report
    assert Path(f"{out}_rss.png").stat().st_size > 0
