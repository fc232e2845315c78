"""The KV-event publisher's settings, read as SGLang 0.5.23 reads `--kv-events-config`.

SGLang's `KVEventsConfig` (disaggregation/kv_events.py) takes a JSON object; the emulator honours
the keys that shape the feed: `publisher` ("null" = off, "zmq"), `endpoint`, `replay_endpoint`,
`bind`, `topic`, `buffer_steps`, `hwm`. Its PUB socket **binds** only with `"bind": true`, or,
with `bind` unset, when the endpoint names a wildcard host (`*`, `0.0.0.0`, `::`) or is
`ipc://`/`inproc://`; otherwise it **connects** to the endpoint (a subscriber must bind there),
so `tcp://127.0.0.1:5557` without `"bind": true` publishes to nobody a router can reach. The
replay ROUTER socket always binds. `/server_info`'s `kv_events` descriptor is built as SGLang's
`describe_kv_events_publisher` builds it: from the endpoint's host and port, also when the
socket connects, and `null` for a non-TCP endpoint.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

DEFAULT_ENDPOINT = "tcp://*:5557"  # KVEventsConfig.endpoint's default
_WILDCARDS = ("*", "::", "0.0.0.0")  # SGLang tests these as substrings of the endpoint
_KEYS = frozenset(
    {"publisher", "endpoint", "bind", "replay_endpoint", "buffer_steps", "hwm",
     "max_queue_size", "topic", "format"}
)  # fmt: skip


def _tcp_host_port(endpoint: str | None) -> tuple[str, int] | None:
    """(host, port) of a tcp:// endpoint (IPv6 hosts bracketed), else None."""
    if not endpoint or not endpoint.startswith("tcp://"):
        return None
    host, sep, port = endpoint[len("tcp://") :].rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        return None
    if ":" in host and not host.startswith("["):
        return None  # bare IPv6 is ambiguous; SGLang rejects it too
    return host, int(port)


@dataclass(frozen=True, slots=True)
class KvEventsConfig:
    publisher: str = "null"
    endpoint: str = DEFAULT_ENDPOINT
    bind: bool | None = None
    replay_endpoint: str | None = None
    topic: str = ""
    buffer_steps: int = 10000
    hwm: int = 100000
    raw: str = ""  # the JSON as given (what /server_info reports as kv_events_config)

    @classmethod
    def from_json(cls, text: str) -> KvEventsConfig:
        """Parse `--kv-events-config`; ValueError on malformed JSON, unknown keys or bad types."""
        try:
            obj: Any = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--kv-events-config is not JSON: {exc}") from exc
        if not isinstance(obj, dict):
            raise ValueError("--kv-events-config must be a JSON object")
        unknown = set(obj) - _KEYS
        if unknown:
            raise ValueError(f"--kv-events-config: unknown keys {sorted(unknown)}")
        cfg = cls(
            publisher=_typed(obj, "publisher", str, "null"),
            endpoint=_typed(obj, "endpoint", str, DEFAULT_ENDPOINT),
            bind=_typed(obj, "bind", bool, None),
            replay_endpoint=_typed(obj, "replay_endpoint", str, None),
            topic=_typed(obj, "topic", str, ""),
            buffer_steps=_typed(obj, "buffer_steps", int, 10000),
            hwm=_typed(obj, "hwm", int, 100000),
            raw=text,
        )
        if cfg.publisher not in ("null", "zmq"):
            raise ValueError(f"--kv-events-config: publisher {cfg.publisher!r} is not null or zmq")
        return cfg

    @classmethod
    def bound(cls, host: str, port: int, replay_port: int | None, topic: str) -> KvEventsConfig:
        """What --kv-events-port means: bind on the worker's host, as the launcher configures
        real SGLang workers (`"bind": true`)."""
        replay = None if replay_port is None else f"tcp://{host}:{replay_port}"
        d: dict[str, Any] = {"publisher": "zmq", "endpoint": f"tcp://{host}:{port}"}
        if replay is not None:
            d["replay_endpoint"] = replay
        d["bind"] = True
        if topic:
            d["topic"] = topic
        return cls.from_json(json.dumps(d, separators=(",", ":")))

    @property
    def enabled(self) -> bool:
        return self.publisher == "zmq"

    @property
    def binds(self) -> bool:
        """Whether the PUB socket binds (else it connects), by SGLang's rule."""
        if self.bind is not None:
            return self.bind
        ep = self.endpoint
        return any(w in ep for w in _WILDCARDS) or ep.startswith(("ipc://", "inproc://"))

    def descriptor(self, block_size: int) -> dict[str, object] | None:
        """/server_info's `kv_events`: None when off or the endpoint is not a TCP address."""
        if not self.enabled or block_size <= 0:
            return None
        kv = _tcp_host_port(self.endpoint)
        if kv is None:
            return None
        d: dict[str, object] = {
            "publisher": self.publisher,
            "endpoint_host": kv[0],
            "endpoint_port_base": kv[1],
            "topic": self.topic,
            "block_size": block_size,
            "dp_size": 1,
        }
        replay = _tcp_host_port(self.replay_endpoint)
        if replay is not None:
            d["replay_endpoint_port_base"] = replay[1]
        return d


def _typed(obj: dict[str, Any], key: str, kind: type, default: Any) -> Any:
    value = obj.get(key, default)
    if value is None and default is None:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"--kv-events-config: {key} must be a {kind.__name__}")
    return value
