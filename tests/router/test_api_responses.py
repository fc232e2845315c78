"""The Responses id codec and rewriting (router/api_responses.py): ids round-trip and name their
worker, anything else (tampered, other key, truncated, not base64) is refused; worker ids become
router ids in JSON bodies and in SSE streams cut at any byte; the key comes from the flag or the
environment."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from smetric_router.router.api_responses import IdRewriter, ResponseIds, RewrittenStream
from smetric_router.router.cli import config_from_args
from smetric_router.router.errors import RouterError

W1, W2 = "http://127.0.0.1:30001", "http://127.0.0.1:30002"
WID = "resp_" + "ab" * 16
PREV = "resp_" + "cd" * 16


def test_ids_round_trip_and_name_their_worker() -> None:
    ids = ResponseIds("k" * 32)
    token = ids.encode(W1, WID)
    assert token.startswith("resp_") and WID not in token
    assert ids.decode(token) == (ResponseIds.tag(W1), WID)
    assert ids.encode(W1, WID) == token  # deterministic: replicas with the key agree
    assert ids.decode(ids.encode(W2, WID)) == (ResponseIds.tag(W2), WID)
    assert ResponseIds("k" * 32).decode(token) is not None  # same key, another router


@pytest.mark.parametrize(
    "bad",
    [
        "resp_" + "0" * 32,
        "resp_",
        "resp_!!",
        "resp_é",
        "xyz",
        "",
        None,
        17,
    ],
)
def test_ids_not_issued_here_are_refused(bad: Any) -> None:
    assert ResponseIds("k" * 32).decode(bad) is None


def test_every_tampered_character_and_another_key_are_refused() -> None:
    ids = ResponseIds("k" * 32)
    token = ids.encode(W1, WID)
    for i in range(len("resp_"), len(token)):
        for c in "AZaz09-_":
            if token[i] != c:
                forged = token[:i] + c + token[i + 1 :]
                assert ids.decode(forged) in (None, ids.decode(token)), forged
    assert ResponseIds("other" * 8).decode(token) is None
    assert ids.decode(token[:-2]) is None


def _registry(*workers: tuple[str, bool]) -> Any:
    return SimpleNamespace(workers={u: SimpleNamespace(url=u, healthy=ok) for u, ok in workers})


def test_holder_lookup_and_its_errors() -> None:
    ids = ResponseIds("k" * 32)
    token = ids.encode(W2, WID)
    worker, wid = ids.holder(_registry((W1, True), (W2, True)), token, "previous_response_id")
    assert (worker.url, wid) == (W2, WID)
    with pytest.raises(RouterError) as e:
        ids.holder(_registry((W1, True)), token, "response_id")
    assert (e.value.status, e.value.code) == (404, "response_holder_unavailable")
    assert "removed" in e.value.message
    with pytest.raises(RouterError) as e:
        ids.holder(_registry((W1, True), (W2, False)), token, "response_id")
    assert e.value.status == 404 and f"{W2} is down" in e.value.message
    with pytest.raises(RouterError) as e:
        ids.holder(_registry((W1, True)), "resp_forged", "previous_response_id")
    assert (e.value.status, e.value.code, e.value.param) == (
        400,
        "invalid_response_id",
        "previous_response_id",
    )


def _response(rid: str, prev: str | None) -> dict[str, Any]:
    return {"id": rid, "object": "response", "previous_response_id": prev, "output": []}


def test_whole_body_ids_rewritten() -> None:
    ids = ResponseIds("k" * 32)
    prev_token = ids.encode(W1, PREV)
    rw = IdRewriter(ids, W1, {PREV: prev_token})
    out = orjson.loads(rw.whole(orjson.dumps(_response(WID, PREV))))
    assert out["id"] == ids.encode(W1, WID) and out["previous_response_id"] == prev_token
    # an error naming the restored id names the client's
    err = orjson.dumps({"error": {"message": f"Response with id '{PREV}' not found."}})
    assert WID not in IdRewriter(ids, W1, {PREV: prev_token}).whole(err).decode()


def _sse() -> bytes:
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": _response(WID, PREV)},
        {"type": "response.in_progress", "response": _response(WID, PREV)},
        {"type": "response.output_text.delta", "delta": "hi", "item_id": "msg_1"},
        {"type": "response.completed", "response": _response(WID, PREV)},
    ]
    return b"".join(
        b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in events
    )


class _Chunks:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def readany(self) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""

    def is_eof(self) -> bool:
        return not self.chunks


def _read(stream: RewrittenStream) -> bytes:
    async def run() -> bytes:
        out = b""
        while True:
            chunk = await stream.readany()
            if not chunk:
                return out
            assert chunk.endswith(b"\n\n") or stream.is_eof(), chunk  # whole events only
            out += chunk

    return asyncio.run(run())


def test_stream_ids_rewritten_whatever_the_chunk_boundaries() -> None:
    ids = ResponseIds("k" * 32)
    prev_token = ids.encode(W1, PREV)
    sse = _sse()
    want = sse.replace(WID.encode(), ids.encode(W1, WID).encode()).replace(
        PREV.encode(), prev_token.encode()
    )
    for cut in range(1, len(sse)):
        for parts in ([sse[:cut], sse[cut:]], [sse[:cut], sse[cut : cut + 7], sse[cut + 7 :]]):
            rw = IdRewriter(ids, W1, {PREV: prev_token})
            got = _read(RewrittenStream(_Chunks([p for p in parts if p]), rw))
            assert got == want, cut
    # a stream cut inside an event: what came is passed on as it is at the end
    rw = IdRewriter(ids, W1, {})
    assert _read(RewrittenStream(_Chunks([sse[:-40]]), rw)).endswith(sse[-60:-40])


def test_key_from_flag_or_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SMETRIC_RESPONSE_ID_KEY", raising=False)
    assert config_from_args([]).response_id_key is None
    assert config_from_args(["--response-id-key", "x" * 20]).response_id_key == "x" * 20
    monkeypatch.setenv("SMETRIC_RESPONSE_ID_KEY", "y" * 20)
    assert config_from_args([]).response_id_key == "y" * 20
    assert "y" * 20 not in repr(config_from_args([]))  # a logged config shows no secret
    with pytest.raises(SystemExit):
        config_from_args(["--response-id-key", "short"])
