"""Settings of one emulated worker process."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from smetric_router.core.flags import Flag, nested, option
from smetric_router.emulator.kv_config import KvEventsConfig
from smetric_router.emulator.mooncake_tier import FLAG_GROUP as TIER_GROUP
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


PD = "PD disaggregation"
# The flags' argument groups (title -> what --help says of them), in --help's order.
FLAG_GROUPS = {
    PD: "prefill: computes the prompt, answers with the first token and offers the KV under the "
    "request's bootstrap_room on its bootstrap port; decode: fetches that KV from "
    "bootstrap_host:bootstrap_port, waits the modelled transfer, then decodes the answer",
    TIER_GROUP: "mooncake: HiCache's L3 in a real Mooncake store, under SGLang's keys; the client "
    "is set up from the MOONCAKE_* environment SGLang's MooncakeStore reads (MOONCAKE_MASTER, "
    "MOONCAKE_TE_META_DATA_SERVER, MOONCAKE_PROTOCOL, MOONCAKE_DEVICE, "
    "MOONCAKE_GLOBAL_SEGMENT_SIZE, MOONCAKE_LOCAL_HOSTNAME; MC_TCP_BIND_ADDRESS for tcp)",
}


@dataclass(frozen=True, slots=True)
class EmulatorConfig:
    """One emulated worker; each field declares the flag that sets it (core/flags.py)."""

    host: str = option("127.0.0.1", Flag("--host", "address to listen on"))
    port: int = option(30000, Flag("--port", "HTTP port; 0 = any free port"))
    model_name: str = option(DEFAULT_MODEL_NAME, Flag("--model-name", "served model name"))
    # the HF tokenizer directory prompts are tokenized with ("" only before the CLI fills it)
    tokenizer_path: str = option(
        "",
        Flag(
            "--tokenizer-path",
            "HF tokenizer (or model) directory, read offline",
            default_text="the bundled one",
        ),
    )
    chat_template: str | None = option(
        None,
        Flag(
            "--chat-template",
            "a Jinja chat template file (.jinja) used instead of the tokenizer's own, read as "
            "SGLang reads its --chat-template",
        ),
    )
    kv_events_port: int | None = option(
        None, Flag("--kv-events-port", "ZMQ PUB port (0 = any)", default_text="off")
    )
    kv_events_replay_port: int | None = option(
        None,
        Flag(
            "--kv-events-replay-port", "ZMQ replay (ROUTER) port (0 = any); needs --kv-events-port"
        ),
    )
    kv_events_topic: str = option("", Flag("--kv-events-topic", "topic of the KV-event frames"))
    kv_events_config: str | None = option(
        None,
        Flag(
            "--kv-events-config",
            "SGLang's KV-event JSON instead of the --kv-events-* ports, e.g. "
            '\'{"publisher":"zmq","endpoint":"tcp://127.0.0.1:5557","bind":true}\'; as in SGLang '
            'the PUB socket binds only with "bind": true or a wildcard host (tcp://*:P), else it '
            "connects to the endpoint",
        ),
    )
    speedup: float = option(1.0, Flag("--speedup", "model seconds per wall second"))
    role: Role = option(
        "null",
        Flag(
            "--role",
            "SGLang's --disaggregation-mode; null = colocated",
            aliases=("--disaggregation-mode",),
            group=PD,
        ),
    )
    bootstrap_port: int = option(
        DEFAULT_BOOTSTRAP_PORT,
        Flag(
            "--disaggregation-bootstrap-port",
            "prefill: port of the KV handover endpoint (0 = any free port)",
            group=PD,
        ),
    )
    transfer_gbps: float = option(
        DEFAULT_TRANSFER_GBPS,
        Flag(
            "--transfer-gbps",
            "decode: modelled prefill -> decode KV link in Gbit/s (scaled by --speedup)",
            group=PD,
        ),
    )
    decode_kv_timeout_s: float = option(
        DEFAULT_DECODE_KV_TIMEOUT_S,
        Flag(
            "--decode-kv-timeout-secs",
            "decode: wall seconds to wait for a request's KV before failing it",
            group=PD,
        ),
    )
    context_length: int | None = option(
        None,
        Flag(
            "--context-length",
            "the model's context length (SGLang's --context-length), reported as /v1/models "
            "max_model_len; prompts that reach it, and max_tokens that with the prompt exceed "
            "it, are refused with 400 as SGLang refuses them",
            default_text="the GPU-tier KV capacity",
        ),
    )
    engine: EngineConfig = field(default_factory=EngineConfig, metadata=nested())
    global_tier: GlobalTierKind = option(
        "none",
        Flag(
            "--global-tier",
            "the engine's global KV tier (not on a decode instance)",
            group=TIER_GROUP,
        ),
    )
    mooncake: TierOptions = field(default_factory=TierOptions, metadata=nested())
    api_key: str | None = option(
        None,
        Flag(
            "--api-key",
            "as SGLang's --api-key: every endpoint but /health*, /ready* and /metrics* then "
            "needs 'Authorization: Bearer KEY' (401 otherwise)",
            metavar="KEY",
        ),
        repr=False,
    )

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
