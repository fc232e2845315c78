"""Settings of one emulated worker process."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from smetric_router.engine.api import EngineConfig

NOTICE = (
    "emulated SGLang worker: a test and benchmark tool that speaks SGLang's HTTP surface and "
    "KV-event feed over an engine model; it runs no model and its answers are synthetic"
)
SGLANG_VERSION = "0.5.23"  # the HTTP surface emulated
DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's sampling_params default (/generate)
DEFAULT_MODEL_NAME = "emulated-sglang-worker"
DEFAULT_OPENAI_MAX_TOKENS = 64  # OpenAI endpoints without max_tokens: a modest synthetic answer
DEFAULT_BOOTSTRAP_PORT = 8998  # SGLang's --disaggregation-bootstrap-port default
DEFAULT_TRANSFER_GBPS = 200.0  # DESIGN §6: one 200 Gbps RDMA NIC per server
DEFAULT_DECODE_KV_TIMEOUT_S = 300.0

Role = Literal["null", "prefill", "decode"]  # SGLang's --disaggregation-mode; null = colocated
ROLES: tuple[Role, ...] = ("null", "prefill", "decode")


@dataclass(frozen=True, slots=True)
class EmulatorConfig:
    host: str = "127.0.0.1"
    port: int = 30000
    model_name: str = DEFAULT_MODEL_NAME
    tokenizer_path: str = ""  # resolved directory of the chat codec's tokenizer
    kv_events_port: int | None = None  # ZMQ PUB port; None: events off
    kv_events_replay_port: int | None = None
    kv_events_topic: str = ""
    speedup: float = 1.0  # model seconds per wall second
    role: Role = "null"
    bootstrap_port: int = DEFAULT_BOOTSTRAP_PORT  # prefill: where decode fetches its KV
    transfer_gbps: float = DEFAULT_TRANSFER_GBPS  # the modelled prefill -> decode KV link
    decode_kv_timeout_s: float = DEFAULT_DECODE_KV_TIMEOUT_S  # decode: wall seconds to wait for KV
    engine: EngineConfig = field(default_factory=EngineConfig)

    @property
    def kv_events_endpoint(self) -> str | None:
        return None if self.kv_events_port is None else f"tcp://{self.host}:{self.kv_events_port}"

    @property
    def kv_events_replay_endpoint(self) -> str | None:
        port = self.kv_events_replay_port
        return None if port is None or self.kv_events_port is None else f"tcp://{self.host}:{port}"

    def kv_events_descriptor(self) -> dict[str, object] | None:
        """/server_info's `kv_events`, shaped as SGLang's describe_kv_events_publisher builds it."""
        if self.kv_events_port is None:
            return None
        d: dict[str, object] = {
            "publisher": "zmq",
            "endpoint_host": self.host,
            "endpoint_port_base": self.kv_events_port,
            "topic": self.kv_events_topic,
            "block_size": self.engine.page_size,
            "dp_size": 1,
        }
        if self.kv_events_replay_port is not None:
            d["replay_endpoint_port_base"] = self.kv_events_replay_port
        return d
