"""The patched probe past the tree: the scheduler handler and its dispatcher entry, the IPC
(msgpack) round trip, the tokenizer manager's DP fan-out, and the HTTP route, all SGLang's own
code; only the ZMQ hop and the scheduler process are stood in for. Runs in the CPU SGLang env with
the patch applied; prints ``RESULT <json>`` as its last line.

Two DP ranks: rank 0 is SGLang's default cache (Rust tree core, HiCache) holding A and B with A's
last 8 tokens evicted to host; rank 1 is a Python-core cache holding A's first 12 tokens.
"""

from __future__ import annotations

import asyncio
import json
import types
from typing import Any

from cpu_cache import PAGE, A, B, build, insert
from sglang.srt.entrypoints import http_server
from sglang.srt.managers.communicator import FanOutCommunicator
from sglang.srt.managers.io_struct import (
    SmetricPrefixMatchReq,
    SmetricPrefixMatchReqOutput,
    msgpack_decode,
    msgpack_encode,
)
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.managers.tokenizer_control_mixin import (
    _COMMUNICATOR_SPECS,
    TokenizerControlMixin,
)
from sglang.srt.mem_cache.base_prefix_cache import EvictParams
from starlette.testclient import TestClient


class _Placeholder:
    """Any attribute, never called: stands for the scheduler parts the probe does not use."""

    def __getattr__(self, name: str) -> _Placeholder:
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a placeholder scheduler handler was called")


class SchedulerStandIn:
    """Just what the handler reads (tree_cache, page_size); any other attribute the dispatcher
    setup touches is a placeholder, so SGLang's own init_request_dispatcher builds the table."""

    smetric_prefix_match = Scheduler.smetric_prefix_match

    def __init__(self, tree_cache: Any) -> None:
        self.tree_cache = tree_cache
        self.page_size = PAGE
        Scheduler.init_request_dispatcher(self)

    def __getattr__(self, name: str) -> Any:
        return _Placeholder()


def ipc(obj: Any) -> Any:
    return msgpack_decode(msgpack_encode(obj))


def tokenizer_manager(ranks: list[SchedulerStandIn]) -> Any:
    """A stand-in TokenizerManager running the mixin's own smetric_prefix_match over a real
    FanOutCommunicator; each DP rank's scheduler answers through its request dispatcher."""
    tm = types.SimpleNamespace(auto_create_handle_loop=lambda: None)

    def send(req: SmetricPrefixMatchReq) -> None:
        comm = tm.smetric_prefix_match_communicator
        loop = asyncio.get_running_loop()
        for rank in ranks:  # replies arrive later, as from the result loop
            reply = ipc(rank._request_dispatcher(ipc(req)))
            loop.call_soon(comm.handle_recv, reply)

    async def probe(req: SmetricPrefixMatchReq) -> list[SmetricPrefixMatchReqOutput]:
        # One communicator per call: TestClient runs each request on a fresh event loop.
        tm.smetric_prefix_match_communicator = FanOutCommunicator(send, len(ranks), "queueing")
        mixin_method = TokenizerControlMixin.smetric_prefix_match  # the patch's own code
        replies: list[SmetricPrefixMatchReqOutput] = await mixin_method(tm, req)
        return replies

    tm.smetric_prefix_match = probe
    return tm


def post(client: TestClient, body: Any) -> dict[str, Any]:
    r = client.post("/smetric/prefix_match", json=body)
    return {"status": r.status_code, "body": r.json()}


def main() -> None:
    rank0, alloc0 = build(None, hicache=True)
    for ids in (A, B):
        insert(rank0, alloc0, ids)
    rank0.writing_check(write_back=True)
    rank0.evict(EvictParams(num_tokens=8))  # A's leaf (the older) to host
    rank1, alloc1 = build("python", hicache=False)
    insert(rank1, alloc1, A[:12])
    out: dict[str, Any] = {"cores": [type(c.tree_core).__name__ for c in (rank0, rank1)]}

    req = ipc(SmetricPrefixMatchReq(input_ids=[A, A[:9], B, []]))
    out["ipc_req"] = [type(req).__name__, req.input_ids]
    handler = Scheduler.smetric_prefix_match  # unbound, on a stand-in self
    reply = ipc(handler(types.SimpleNamespace(tree_cache=rank0, page_size=PAGE), req))
    out["handler"] = [type(reply).__name__, reply.page_size, reply.device, reply.host, reply.error]
    odd = ipc(handler(types.SimpleNamespace(tree_cache=object(), page_size=PAGE), req))
    out["handler_unsupported"] = odd.error
    out["communicator_spec"] = [
        [spec[0], spec[1].__name__] for spec in _COMMUNICATOR_SPECS if spec[0].startswith("smetric")
    ]

    ranks = [SchedulerStandIn(rank0), SchedulerStandIn(rank1)]
    http_server._global_state = types.SimpleNamespace(tokenizer_manager=tokenizer_manager(ranks))
    client = TestClient(http_server.app)
    out["route"] = post(client, {"input_ids": [A, A[:9], B]})
    out["route_flat"] = post(client, {"input_ids": A})
    out["route_bad"] = [
        post(client, body)["status"]
        for body in ({"input_ids": "x"}, {"input_ids": [[1, "a"]]}, [1])
    ]
    ranks[1] = SchedulerStandIn(object())  # a rank whose cache is no UnifiedRadixCache
    out["route_unsupported"] = post(client, {"input_ids": [A]})
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
