"""Settings of one emulated worker process."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from smetric_router.emulator.kv_config import KvEventsConfig
from smetric_router.emulator.mooncake_tier import TierOptions
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
GlobalTierKind = Literal["none", "mooncake"]
GLOBAL_TIERS: tuple[GlobalTierKind, ...] = ("none", "mooncake")


@dataclass(frozen=True, slots=True)
class EmulatorConfig:
    host: str = "127.0.0.1"
    port: int = 30000
    model_name: str = DEFAULT_MODEL_NAME
    tokenizer_path: str = ""  # the HF tokenizer directory prompts are tokenized with
    chat_template: str | None = None  # SGLang's --chat-template (.jinja); None: the tokenizer's
    kv_events_port: int | None = None  # ZMQ PUB port; None: events off
    kv_events_replay_port: int | None = None
    kv_events_topic: str = ""
    kv_events_config: str | None = None  # SGLang's --kv-events-config JSON; overrides the ports
    speedup: float = 1.0  # model seconds per wall second
    role: Role = "null"
    bootstrap_port: int = DEFAULT_BOOTSTRAP_PORT  # prefill: where decode fetches its KV
    transfer_gbps: float = DEFAULT_TRANSFER_GBPS  # the modelled prefill -> decode KV link
    decode_kv_timeout_s: float = DEFAULT_DECODE_KV_TIMEOUT_S  # decode: wall seconds to wait for KV
    engine: EngineConfig = field(default_factory=EngineConfig)
    global_tier: GlobalTierKind = "none"  # mooncake: L3 in a real store (MOONCAKE_* environment)
    mooncake: TierOptions = field(default_factory=TierOptions)
    api_key: str | None = field(default=None, repr=False)  # SGLang's --api-key

    def kv_events(self) -> KvEventsConfig | None:
        """The publisher's settings: --kv-events-config as SGLang reads it, else --kv-events-port
        (bound on `host`, like `"bind": true`); None when off."""
        if self.kv_events_config is not None:
            cfg = KvEventsConfig.from_json(self.kv_events_config)
            return cfg if cfg.enabled else None
        if self.kv_events_port is None:
            return None
        return KvEventsConfig.bound(
            self.host, self.kv_events_port, self.kv_events_replay_port, self.kv_events_topic
        )

    @property
    def kv_events_endpoint(self) -> str | None:
        cfg = self.kv_events()
        return None if cfg is None else cfg.endpoint
