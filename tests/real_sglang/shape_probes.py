"""The requests of the emulator-vs-real-SGLang shape test, and what each worker answered.

`capture(url)` sends one fixed sequence of requests (every endpoint the router and the benchmark
clients use, streamed and not, plus malformed ones) to a worker and records each reply as a
JSON-like tree; `KvTap` records the worker's KV-event frames meanwhile and asks its replay socket
for them afterwards. The two workers get the same sequence, so their trees compare key by key.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import msgspec
import zmq

from smetric_router.launch.kinds.sglang import TINY_MODEL_NAME

# A prompt of 2.5 pages of 16 tokens, in both workers' vocabulary (the same bundled tokenizer):
# the second send hits 32 cached tokens.
PROMPT_IDS = [100 + (7 * i) % 400 for i in range(40)]
PROMPT_TEXT = "def add(a, b):\n    return a + b\n\n# a small helper that adds two numbers together"
MESSAGES = [
    {"role": "system", "content": "You are a helpful coding assistant. " * 4},
    {"role": "user", "content": "Write a function that adds two numbers."},
]
NEW_TOKENS = 4
# ignore_eos: both workers answer exactly NEW_TOKENS tokens (the emulator's natural lengths and
# the real model's EOS would differ); Messages and Responses have no such field
SAMPLING = {"max_new_tokens": NEW_TOKENS, "temperature": 0.0, "ignore_eos": True}


@dataclass(frozen=True, slots=True)
class Exact:
    """A value compared as is, not by type (status codes, content types, wire layouts)."""

    value: str


@dataclass(frozen=True, slots=True)
class Probe:
    name: str
    method: str
    path: str
    body: Any = None  # JSON-encoded unless raw is set
    raw: bytes | None = None


def _json_probe(name: str, path: str, body: Any) -> Probe:
    return Probe(name, "POST", path, body)


def _chat(**extra: Any) -> dict[str, Any]:
    return {"messages": MESSAGES, "max_tokens": NEW_TOKENS, "temperature": 0.0, "ignore_eos": True,
            **extra}  # fmt: skip


def _completion(**extra: Any) -> dict[str, Any]:
    return {"prompt": PROMPT_TEXT, "max_tokens": NEW_TOKENS, "temperature": 0.0,
            "ignore_eos": True, **extra}  # fmt: skip


def _generate(**extra: Any) -> dict[str, Any]:
    return {"input_ids": PROMPT_IDS, "sampling_params": SAMPLING, **extra}


USAGE = {"stream_options": {"include_usage": True}}
TOOLS = [
    {
        "name": "read_file",
        "description": "Read a file",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
]
TOOL_TURNS = [
    {"role": "user", "content": "Fix the test."},
    {"role": "assistant", "content": [
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a.py"}}]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "def f(): pass"}]},
]  # fmt: skip


def _messages(**extra: Any) -> dict[str, Any]:
    """Anthropic Messages: the chat probes' conversation (so its prompt is cached by then)."""
    return {"model": "m", "max_tokens": NEW_TOKENS, "temperature": 0.0,
            "system": MESSAGES[0]["content"], "messages": MESSAGES[1:], **extra}  # fmt: skip


def _responses(**extra: Any) -> dict[str, Any]:
    """OpenAI Responses: the chat probes' conversation again (its prompt is cached by then)."""
    # the real worker's model name (SGLang's Responses endpoint refuses others; any passes
    # the emulator)
    body = {"model": TINY_MODEL_NAME, "max_output_tokens": NEW_TOKENS + 2, "temperature": 0.0}
    return {
        **body,
        "instructions": MESSAGES[0]["content"],
        "input": MESSAGES[1]["content"],
        **extra,
    }


RESPONSE_ITEMS = [
    {"role": "user", "content": [{"type": "input_text", "text": "Read a.py"}]},
    {"type": "function_call", "call_id": "c1", "name": "read_file", "arguments": '{"path": "a"}'},
    {"type": "function_call_output", "call_id": "c1", "output": "x = 1"},
]


PROBES: tuple[Probe, ...] = (
    Probe("flush_cache_post", "POST", "/flush_cache"),
    Probe("health", "GET", "/health"),
    Probe("health_generate", "GET", "/health_generate"),
    Probe("ready", "GET", "/ready"),
    Probe("server_info", "GET", "/server_info"),
    Probe("model_info", "GET", "/model_info"),
    Probe("v1_models", "GET", "/v1/models"),
    Probe("v1_loads_idle", "GET", "/v1/loads"),
    Probe("v1_loads_prometheus", "GET", "/v1/loads?format=prometheus"),
    # /generate: cold, then a cache hit (cached_tokens_details appears), streamed, text input
    _json_probe("generate_cold", "/generate", _generate()),
    _json_probe("generate_hit", "/generate", _generate()),
    _json_probe("generate_stream", "/generate", _generate(stream=True)),
    _json_probe("generate_text", "/generate", {"text": PROMPT_TEXT, "sampling_params": SAMPLING}),
    _json_probe("generate_rid", "/generate", _generate(rid="shape-test-rid")),
    _json_probe(
        "generate_zero_tokens", "/generate", _generate(sampling_params={"max_new_tokens": 0})
    ),
    # OpenAI chat: any model name is served and echoed back
    _json_probe("chat", "/v1/chat/completions", _chat(model="whatever-model")),
    _json_probe("chat_no_model", "/v1/chat/completions", _chat()),
    _json_probe(
        "chat_details", "/v1/chat/completions", _chat(model="m", return_cached_tokens_details=True)
    ),
    _json_probe("chat_stream", "/v1/chat/completions", _chat(model="m", stream=True)),
    _json_probe(
        "chat_stream_usage",
        "/v1/chat/completions",
        _chat(model="m", stream=True, return_cached_tokens_details=True, **USAGE),
    ),
    _json_probe("chat_lora_syntax", "/v1/chat/completions", _chat(model="base:adapter")),
    # OpenAI completions
    _json_probe("completion", "/v1/completions", _completion(model="whatever-model")),
    _json_probe("completion_ids", "/v1/completions", {**_completion(), "prompt": PROMPT_IDS}),
    _json_probe("completion_stream", "/v1/completions", _completion(stream=True, **USAGE)),
    _json_probe(
        "completion_details", "/v1/completions", _completion(return_cached_tokens_details=True)
    ),
    # Anthropic Messages (a cache hit: the chat probes sent the same prompt), with tools
    _json_probe("messages", "/v1/messages", _messages()),
    _json_probe("messages_stream", "/v1/messages", _messages(stream=True)),
    _json_probe("messages_tools", "/v1/messages", _messages(tools=TOOLS, messages=TOOL_TURNS)),
    _json_probe(
        "messages_tools_stream",
        "/v1/messages",
        _messages(tools=TOOLS, messages=TOOL_TURNS, stream=True),
    ),
    _json_probe(
        "messages_count_tokens",
        "/v1/messages/count_tokens",
        {"model": "m", "messages": TOOL_TURNS, "tools": TOOLS},
    ),
    Probe("messages_bad_json", "POST", "/v1/messages", raw=b"{not json"),
    _json_probe("messages_no_messages", "/v1/messages", {"model": "m", "max_tokens": 2}),
    _json_probe("messages_no_max_tokens", "/v1/messages", _messages(max_tokens=None)),
    _json_probe("messages_too_long", "/v1/messages", _messages(max_tokens=10**7)),
    _json_probe(
        "messages_thinking",
        "/v1/messages",
        _messages(thinking={"type": "enabled", "budget_tokens": 2048}),
    ),
    _json_probe("messages_count_tokens_no_model", "/v1/messages/count_tokens", {"messages": []}),
    # OpenAI Responses (SGLang with --enable-response-store): GET and cancel of a real id
    # need the id the reply gave; those go through the router (tests/real_sglang and e2e)
    _json_probe("responses", "/v1/responses", _responses()),
    _json_probe("responses_stream", "/v1/responses", _responses(stream=True)),
    _json_probe(
        "responses_items",
        "/v1/responses",
        _responses(
            input=RESPONSE_ITEMS,
            tools=[{"type": "function", "name": "read_file", "parameters": {"type": "object"}}],
        ),
    ),
    _json_probe("responses_not_stored", "/v1/responses", _responses(store=False)),
    _json_probe("responses_no_input", "/v1/responses", {"model": TINY_MODEL_NAME}),
    _json_probe(
        "responses_prev_unknown",
        "/v1/responses",
        _responses(previous_response_id="resp_" + "0" * 32),
    ),
    _json_probe("responses_prev_invalid", "/v1/responses", _responses(previous_response_id="x")),
    Probe("responses_get_unknown", "GET", "/v1/responses/resp_" + "0" * 32),
    Probe("responses_get_invalid", "GET", "/v1/responses/x"),
    Probe("responses_cancel_unknown", "POST", "/v1/responses/resp_" + "0" * 32 + "/cancel"),
    # malformed requests
    Probe("generate_bad_json", "POST", "/generate", raw=b"{not json"),
    Probe("chat_bad_json", "POST", "/v1/chat/completions", raw=b"{not json"),
    Probe("completion_bad_json", "POST", "/v1/completions", raw=b"{not json"),
    _json_probe("generate_no_input", "/generate", {"sampling_params": SAMPLING}),
    _json_probe(
        "generate_bad_max_new_tokens",
        "/generate",
        _generate(sampling_params={"max_new_tokens": -1}),
    ),
    _json_probe(
        "generate_bad_temperature",
        "/generate",
        _generate(sampling_params={"max_new_tokens": 2, "temperature": -1.0}),
    ),
    _json_probe("chat_no_messages", "/v1/chat/completions", {"max_tokens": 2}),
    _json_probe("chat_bad_max_tokens", "/v1/chat/completions", _chat(max_tokens=-1)),
    _json_probe("chat_bad_max_tokens_type", "/v1/chat/completions", _chat(max_tokens="many")),
    _json_probe("completion_no_prompt", "/v1/completions", {"max_tokens": 2}),
    _json_probe("completion_bad_max_tokens", "/v1/completions", _completion(max_tokens=-1)),
    Probe("not_found", "GET", "/no/such/path"),
    Probe("generate_wrong_method", "GET", "/generate"),
    Probe("v1_loads_bad_include", "GET", "/v1/loads?include=bogus"),
    Probe("v1_loads_bad_dp_rank", "GET", "/v1/loads?dp_rank=7"),
    Probe("flush_cache_bad_timeout", "GET", "/flush_cache?timeout=-1"),
    # after the work
    Probe("v1_loads", "GET", "/v1/loads"),
    Probe("v1_loads_core", "GET", "/v1/loads?include=core"),
    Probe("metrics", "GET", "/metrics"),
    Probe("flush_cache_get", "GET", "/flush_cache"),
)


def _sse(text: str) -> list[Any]:
    events: list[Any] = []
    for block in text.split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data:"):
                data = line[5:].strip()
                events.append(Exact("[DONE]") if data == "[DONE]" else json.loads(data))
    return events


def _prometheus(text: str) -> dict[str, Any]:
    """Metric families by name ({name: type}); samples are values, not shape."""
    families: dict[str, Any] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            families[name] = Exact(kind)
    return families


def _body(content_type: str, raw: bytes, prometheus: bool) -> Any:
    text = raw.decode("utf-8", "replace")
    if content_type.startswith("text/event-stream"):
        return _sse(text)
    if prometheus:
        return _prometheus(text)
    if "json" in content_type:
        try:
            return json.loads(text)
        except ValueError:
            return Exact(f"not JSON: {text[:80]}")
    return "" if not text else "text"


def send(base: str, p: Probe, timeout: float = 120) -> dict[str, Any]:
    """One probe's reply as {status, content_type, body}."""
    data = p.raw if p.raw is not None else None if p.body is None else json.dumps(p.body).encode()
    headers = {"Content-Type": "application/json"} if data is not None else {}
    req = urllib.request.Request(base + p.path, data, headers, method=p.method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, ctype, raw = r.status, r.headers.get("Content-Type", ""), r.read()
    except urllib.error.HTTPError as e:
        status, ctype, raw = e.code, e.headers.get("Content-Type", ""), e.read()
    prometheus = p.path == "/metrics" or "format=prometheus" in p.path
    return {
        "status": Exact(str(status)),
        "content_type": Exact(ctype),
        "body": _body(ctype, raw, prometheus),
    }


def capture(base: str) -> dict[str, Any]:
    return {p.name: send(base, p) for p in PROBES}


# --- KV events -----------------------------------------------------------------------------------


def _endpoint(host: str, port: int) -> str:
    return f"tcp://{'127.0.0.1' if host in ('*', '0.0.0.0', '') else host}:{port}"


def _batch_tree(frames: list[bytes]) -> dict[str, Any]:
    """One PUB message: the frame layout as exact values, the msgpack payload by position."""
    topic, seq, payload = frames
    batch = msgspec.msgpack.decode(payload)
    tree: dict[str, Any] = {
        "frames": Exact(f"{len(frames)} frames, seq {len(seq)} bytes big-endian"),
        "topic": Exact(topic.decode()),
        "payload_type": Exact(type(batch).__name__),
    }
    if isinstance(batch, list):
        tree["payload"] = {f"[{i}]": v for i, v in enumerate(batch)}
    return tree


@dataclass
class KvTap:
    """Subscribes to a worker's KV events (from its /server_info descriptor) in a thread."""

    descriptor: dict[str, Any]
    frames: list[list[bytes]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, self.descriptor["topic"].encode())
        sub.connect(
            _endpoint(self.descriptor["endpoint_host"], self.descriptor["endpoint_port_base"])
        )

        def run() -> None:
            try:
                while not self._stop.is_set():
                    if sub.poll(100):
                        self.frames.append(sub.recv_multipart())
            finally:
                sub.close(linger=0)

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        time.sleep(0.5)  # ZMQ's slow joiner: the subscription must reach the publisher first

    def stop(self, settle_s: float = 1.0) -> None:
        time.sleep(settle_s)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def replay(self, start_seq: int = 0, timeout_s: float = 10) -> list[list[bytes]]:
        """Every buffered batch from start_seq, then the end marker (as the last entry)."""
        port = self.descriptor["replay_endpoint_port_base"]
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        sock = ctx.socket(zmq.DEALER)
        sock.connect(_endpoint(self.descriptor["endpoint_host"], port))
        out: list[list[bytes]] = []
        try:
            sock.send_multipart([b"", start_seq.to_bytes(8, "big")])
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and sock.poll(int(timeout_s * 1000)):
                msg = sock.recv_multipart()[1:]  # drop the empty delimiter
                out.append(msg)
                if msg[1] == (-1).to_bytes(8, "big", signed=True):
                    break
        finally:
            sock.close(linger=0)
        return out

    def tree(self) -> dict[str, Any]:
        """The live feed (seq starting at 0 and consecutive as exact values) and the replay."""
        seqs = [int.from_bytes(f[1], "big") for f in self.frames]
        replayed = self.replay()
        end = replayed[-1] if replayed else []
        return {
            "live": [_batch_tree(f) for f in self.frames],
            "live_seq_consecutive": Exact(str(seqs == list(range(seqs[0], seqs[0] + len(seqs)))))
            if seqs
            else Exact("no frames"),
            "replay": [_batch_tree(f) for f in replayed[:-1]],
            "replay_end": Exact(repr([len(x) for x in end]) + repr(end[1:2])),
        }
