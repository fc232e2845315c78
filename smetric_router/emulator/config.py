"""Settings of one emulated worker process."""

from __future__ import annotations

from dataclasses import dataclass, field

from smetric_router.engine.api import EngineConfig

NOTICE = (
    "emulated SGLang worker: a test and benchmark tool that speaks SGLang's HTTP surface and "
    "KV-event feed over an engine model; it runs no model and its answers are synthetic"
)
SGLANG_VERSION = "0.5.23"  # the HTTP surface emulated
DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's sampling_params default (/generate)
DEFAULT_MODEL_NAME = "emulated-sglang-worker"
DEFAULT_OPENAI_MAX_TOKENS = 64  # OpenAI endpoints without max_tokens: a modest synthetic answer


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
