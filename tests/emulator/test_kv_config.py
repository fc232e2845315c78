"""--kv-events-config as SGLang 0.5.23 reads it: the PUB socket binds only with "bind": true or a
wildcard/ipc endpoint, otherwise it connects (so the subscriber must bind)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import zmq
import zmq.asyncio

from smetric_router.core.kv_events import decode_batch
from smetric_router.emulator.__main__ import config_from_args, parse_args
from smetric_router.emulator.kv_config import KvEventsConfig
from tests.emulator.conftest import PAGE, free_ports, make_config, serving


@pytest.mark.parametrize(
    ("endpoint", "bind", "binds"),
    [
        ("tcp://127.0.0.1:5557", None, False),  # a concrete host without "bind": connect
        ("tcp://127.0.0.1:5557", True, True),
        ("tcp://*:5557", None, True),
        ("tcp://0.0.0.0:5557", None, True),
        ("tcp://[::]:5557", None, True),
        ("tcp://*:5557", False, False),
        ("ipc:///tmp/kv.sock", None, True),
    ],
)
def test_bind_or_connect_follows_sglang(endpoint: str, bind: bool | None, binds: bool) -> None:
    raw: dict[str, str | bool] = {"publisher": "zmq", "endpoint": endpoint}
    if bind is not None:
        raw["bind"] = bind
    assert KvEventsConfig.from_json(json.dumps(raw)).binds is binds


def test_descriptor_as_server_info_reports_it() -> None:
    raw = '{"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558"}'
    cfg = KvEventsConfig.from_json(raw)
    assert cfg.descriptor(16) == {
        "publisher": "zmq", "endpoint_host": "*", "endpoint_port_base": 5557, "topic": "",
        "block_size": 16, "dp_size": 1, "replay_endpoint_port_base": 5558,
    }  # fmt: skip
    assert (
        KvEventsConfig.from_json('{"publisher":"zmq","endpoint":"ipc:///x"}').descriptor(16) is None
    )
    assert KvEventsConfig.from_json('{"endpoint":"tcp://*:1"}').enabled is False  # publisher null
    for bad in ("[1]", '{"publisher":"kafka"}', '{"bind":"yes"}', '{"nope":1}', "{"):
        with pytest.raises(ValueError):
            KvEventsConfig.from_json(bad)


def test_cli_takes_sglang_json_or_ports() -> None:
    raw = '{"publisher":"zmq","endpoint":"tcp://127.0.0.1:9100","bind":true}'
    cfg = config_from_args(parse_args(["--kv-events-config", raw]))
    kv = cfg.kv_events()
    assert kv is not None and kv.binds and kv.endpoint == "tcp://127.0.0.1:9100"
    # the ports mean what the launcher gives real workers: bound on the host, replay beside it
    kv = config_from_args(parse_args(["--kv-events-port", "9000"])).kv_events()
    assert kv is not None and kv.binds and json.loads(kv.raw)["bind"] is True
    for argv in (["--kv-events-config", raw, "--kv-events-port", "9000"],
                 ["--kv-events-config", '{"publisher":"kafka"}']):  # fmt: skip
        with pytest.raises(SystemExit):
            parse_args(argv)


async def test_connecting_publisher_reaches_a_binding_subscriber() -> None:
    """Without "bind": true on a concrete host the worker connects, like SGLang: a subscriber
    that binds the endpoint gets the events; /server_info still advertises the endpoint."""
    (port,) = free_ports(1)
    raw = json.dumps({"publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{port}"})
    ctx = zmq.asyncio.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.bind(f"tcp://127.0.0.1:{port}")
    try:
        config = replace(make_config(), kv_events_config=raw)
        async with serving(config) as w:
            _, info = await w.get("/server_info")
            assert info["kv_events_config"] == raw
            assert info["kv_events"]["endpoint_port_base"] == port
            assert "replay_endpoint_port_base" not in info["kv_events"]
            n = 0
            while not await sub.poll(50):  # the connection comes up asynchronously
                n += 1
                assert n < 200, "no KV events reached the binding subscriber"
                body = {"input_ids": [70_000 + n] * PAGE, "sampling_params": {"max_new_tokens": 1}}
                await w.post("/generate", body)
            _, _, payload = await sub.recv_multipart()
            assert decode_batch(payload).events
    finally:
        sub.close(0)
        ctx.term()
