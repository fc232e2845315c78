"""Property-based fuzzing of the router's HTTP surface, end to end: hypothesis generates >= 10K
requests (methods, known and random paths, odd headers, random bytes, invalid UTF-8, JSON of the
wrong type at every field of the OpenAI and SGLang bodies, deep nesting, NaN literals, duplicate
keys, valid-ish chats with random unicode) and sends them through HTTP to a real router in front
of two emulated workers. Every answer must be below 500, neither process may log a traceback,
and afterwards the router serves a normal chat, its workers are both listed and healthy, and its
in-flight gauge is back to 0.

A 5xx carrying `x-smetric-worker` is a worker's answer the router passed through; one without it
is the router's own. With both workers healthy and nothing killed, neither is acceptable: the
failure message says which it was.

SMETRIC_FUZZ_EXAMPLES overrides the number of requests (e.g. 200 for a quick local run).
"""

from __future__ import annotations

import gzip
import http.client
import json
import os
import re
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from smetric_router.core.port_file import read_port_file
from tests.helpers.polling import eventually_sync
from tests.helpers.prometheus import total

MODEL = "fuzz-model"
EXAMPLES = int(os.environ.get("SMETRIC_FUZZ_EXAMPLES", "10000"))
# The emulated engine runs fast: thousands of generations must fit in a test run.
SPEEDUP = "1000"
START_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 30.0  # a request that takes longer is a hang, reported as such
# What a crashed handler or an unhandled exception leaves in a log.
CRASH_LOG = re.compile(r"Traceback|internal error|Error handling request|Unhandled exception")


# The stack: two emulated workers and a router, each logging to its own file ------------------


@dataclass
class Proc:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    ports: dict[str, int]

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@dataclass
class Stack:
    url: str
    host: str
    port: int
    router: Proc
    workers: list[Proc]
    worker_urls: list[str] = field(default_factory=list)

    def procs(self) -> list[Proc]:
        return [self.router, *self.workers]


def _spawn(name: str, args: list[str], tmp: Path) -> Proc:
    port_file = tmp / f"{name}.ports.json"
    log = tmp / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", *args, "--port-file", str(port_file)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while (ports := read_port_file(port_file)) is None:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited during start-up:\n{log.read_text()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{name} reported no ports in time")
        time.sleep(0.05)
    return Proc(name, proc, log, ports)


def _wait_ok(host: str, port: int, path: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            status, _, _ = _get(host, port, path)
            if status == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{host}:{port}{path} not ready in time")
        time.sleep(0.1)


def _get(host: str, port: int, path: str) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(host, port, timeout=REQUEST_TIMEOUT_S)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def _stop(procs: list[Proc]) -> None:
    for p in procs:
        if p.proc.poll() is None:
            p.proc.terminate()
    for p in procs:
        try:
            p.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.proc.kill()
            p.proc.wait()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("fuzz")
    started: list[Proc] = []
    try:
        for i in range(2):
            args = [
                "smetric_router.emulator",
                "--port",
                "0",
                "--kv-events-port",
                "0",
                "--kv-events-replay-port",
                "0",
                "--model-name",
                MODEL,
                "--speedup",
                SPEEDUP,
                "--log-level",
                "warning",
            ]
            started.append(_spawn(f"worker-{i}", args, tmp))
        urls = [f"http://127.0.0.1:{w.ports['http']}" for w in started]
        for w in started:
            _wait_ok("127.0.0.1", w.ports["http"], "/health")
        args = [
            "smetric_router",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--worker-urls",
            *urls,
            "--load-poll-interval-secs",
            "0.5",
            "--log-level",
            "warning",
        ]
        router = _spawn("router", args, tmp)
        started.append(router)
        port = router.ports["http"]
        _wait_ok("127.0.0.1", port, "/readiness")
        yield Stack(f"http://127.0.0.1:{port}", "127.0.0.1", port, router, started[:2], urls)
    finally:
        _stop(started[::-1])


# A keep-alive client that sends whatever it is given ----------------------------------------


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: tuple[tuple[str, bytes], ...]
    body: bytes | None

    def show(self) -> str:
        body = b"" if self.body is None else self.body
        shown = body[:600] + (b"..." if len(body) > 600 else b"")
        heads = ", ".join(f"{k}: {v[:80]!r}" for k, v in self.headers)
        return f"{self.method} {self.path[:200]} [{heads}] body={shown!r} ({len(body)} bytes)"


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


class Client:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.conn: http.client.HTTPConnection | None = None
        self.sent = 0
        self.statuses: dict[int, int] = {}

    def send(self, r: Request) -> Answer:
        self.sent += 1
        # A connection the router closed after its previous answer is opened anew; a request
        # that gets no answer at all on a fresh connection is a failure.
        for attempt in range(2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(
                    self.host, self.port, timeout=REQUEST_TIMEOUT_S
                )
            conn = self.conn
            try:
                conn.putrequest(r.method, r.path, skip_host=False, skip_accept_encoding=True)
                for k, v in r.headers:
                    conn.putheader(k, v)
                if r.body is not None:
                    conn.putheader("Content-Length", str(len(r.body)))
                conn.endheaders(r.body)
                resp = conn.getresponse()
                answer = Answer(
                    resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
                )
            except (ConnectionError, http.client.BadStatusLine) as e:
                conn.close()
                self.conn = None
                if attempt == 1:
                    raise AssertionError(
                        f"no answer ({type(e).__name__}: {e}) to {r.show()}"
                    ) from None
                continue
            if resp.will_close:
                conn.close()
                self.conn = None
            self.statuses[answer.status] = self.statuses.get(answer.status, 0) + 1
            return answer
        raise AssertionError("unreachable")


# Strategies ---------------------------------------------------------------------------------

GENERATION = ("/v1/chat/completions", "/v1/completions", "/generate")
# DELETE/POST /workers are fuzzed only with bodies that cannot name the test's workers (below).
OTHER_PATHS = (
    "/v1/models",
    "/health",
    "/liveness",
    "/readiness",
    "/metrics",
    "/workers",
    "/flush_cache",
    "/smetric/prefix_match",
)
METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS")

small_text = st.text(max_size=30)
big_int = st.integers(min_value=-(2**80), max_value=2**80)
leaf = (
    st.none()
    | st.booleans()
    | big_int
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=40)
)
any_json = st.recursive(
    leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(small_text, inner, max_size=4),
    max_leaves=12,
)
# A field's wrong value: one of each JSON kind, the edges of numbers, a little nesting (cheap to
# draw: random JSON at every field would make the requests too slow to generate).
wrong: st.SearchStrategy[Any] = st.sampled_from(
    [
        None,
        True,
        False,
        0,
        -1,
        1.5,
        -0.0,
        2**64,
        -(2**63) - 1,
        1e308,
        float("nan"),
        float("inf"),
        "",
        "x",
        "1",
        "null",
        [],
        [None],
        [1, "a"],
        {},
        {"": None},
        {"a": {"b": [[]]}},
        [[[[]]]],
    ]
)


def valid_or_wrong(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(valid, wrong)


# Budgets the workers may run stay small (speed); huge ones must be refused by the router before
# any worker sees them (400 context_length_exceeded), not passed through.
small_budget = st.integers(min_value=-3, max_value=6)
huge_budget = st.sampled_from([10**9, 1e9, 2**63, 10**30])
budget = (
    valid_or_wrong(small_budget)
    | huge_budget
    | st.sampled_from(["5", "", "1e3", 1.5, 2.0, -1e9, True])
)
roles = st.sampled_from(
    [
        "user",
        "assistant",
        "system",
        "tool",
        "developer",
        "function",
        "USER",
        "Assistant",
        "root",
        "latest_reminder",
        "bogus",
        "",
    ]
)
unicode_text = st.text(max_size=200)
content = st.one_of(
    unicode_text,
    st.lists(
        st.fixed_dictionaries(
            {
                "type": st.sampled_from(
                    ["text", "image_url", "thinking", "input_audio", "tool_reference", "bogus"]
                )
                | wrong
            },
            optional={
                "text": unicode_text | wrong,
                "image_url": wrong,
                "thinking": wrong,
                "input_audio": wrong,
                "name": wrong,
            },
        ),
        max_size=3,
    ),
    any_json,
)
tool_call = st.fixed_dictionaries(
    {},
    optional={
        "id": small_text | wrong,
        "type": st.just("function") | wrong,
        "function": st.fixed_dictionaries(
            {}, optional={"name": small_text | wrong, "arguments": small_text | wrong}
        ),
        "index": wrong,
    },
)
tool = st.fixed_dictionaries(
    {"type": st.just("function") | wrong},
    optional={
        "function": st.fixed_dictionaries(
            {"name": small_text | wrong},
            optional={"description": wrong, "parameters": wrong, "strict": wrong},
        )
        | wrong
    },
)
message = st.fixed_dictionaries(
    {"role": roles | wrong},
    optional={
        "content": content,
        "tool_calls": st.lists(tool_call, max_size=2) | wrong,
        "tool_call_id": small_text | wrong,
        "name": small_text | wrong,
        "reasoning_content": unicode_text | wrong,
        "prefix": wrong,
        "phase": wrong,
    },
)
# The hint the router reads (and strips) from raw-prompt bodies.
smetric_hint = st.fixed_dictionaries(
    {},
    optional={
        "turn": valid_or_wrong(st.integers(-2, 5)),
        "history_tokens": valid_or_wrong(st.integers(-10, 10_000)),
    },
)
common_fields = {
    "model": st.sampled_from([MODEL, "default", "", "other:adapter"]) | wrong,
    "max_tokens": budget,
    "max_completion_tokens": budget,
    "stream": valid_or_wrong(st.booleans()) | st.sampled_from(["true", "false", 1, 0]),
    "stream_options": valid_or_wrong(st.fixed_dictionaries({"include_usage": wrong})),
    "temperature": valid_or_wrong(st.floats(0, 2)),
    "top_p": wrong,
    "n": valid_or_wrong(st.integers(-1, 3)),
    "stop": valid_or_wrong(st.lists(small_text, max_size=3)),
    "seed": wrong,
    "logprobs": wrong,
    "user": wrong,
    "smetric": valid_or_wrong(smetric_hint),
    "return_cached_tokens_details": wrong,
    "rid": wrong,
}
chat_body = st.fixed_dictionaries(
    {"messages": st.lists(message, max_size=5) | any_json},
    optional={
        **common_fields,
        "tools": st.lists(tool, max_size=2) | wrong,
        "tool_choice": st.sampled_from(["auto", "none", "required"]) | wrong,
        "chat_template_kwargs": wrong,
        "continue_final_message": wrong,
        "reasoning_effort": wrong,
        "response_format": wrong,
    },
)
# Valid-ish: well-formed requests with random unicode, most of which a worker serves.
_turn = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool"]), "content": unicode_text}
)
valid_chat = st.fixed_dictionaries(
    {
        "model": st.sampled_from([MODEL, "default"]),
        "messages": st.tuples(st.lists(_turn, max_size=4), unicode_text).map(
            lambda t: [*t[0], {"role": "user", "content": t[1]}]
        ),
        "max_tokens": st.integers(1, 8),
    },
    optional={
        "stream": st.booleans(),
        "temperature": st.floats(0, 2),
        "stream_options": st.just({"include_usage": True}),
    },
)
token_ids = st.lists(st.integers(min_value=-5, max_value=200_000), max_size=80) | st.lists(
    big_int, max_size=5
)
prompt = st.one_of(
    unicode_text,
    token_ids,
    st.lists(unicode_text, max_size=3),
    st.lists(token_ids, max_size=3),
    any_json,
)
completion_body = st.fixed_dictionaries({"prompt": prompt}, optional=common_fields)
generate_body = st.fixed_dictionaries(
    {},
    optional={
        "text": unicode_text | wrong,
        "input_ids": token_ids | wrong,
        "sampling_params": valid_or_wrong(
            st.fixed_dictionaries(
                {},
                optional={
                    "max_new_tokens": budget,
                    "temperature": wrong,
                    "ignore_eos": wrong,
                    "stop": wrong,
                },
            )
        ),
        "stream": common_fields["stream"],
        "rid": wrong,
        "smetric": common_fields["smetric"],
        "return_logprob": wrong,
        "bootstrap_room": wrong,
    },
)
admin_body = st.fixed_dictionaries(
    {},
    optional={
        "url": wrong | st.sampled_from(["", "http://", "not a url", "http://[::1"]),
        "role": wrong,
        "bootstrap_port": wrong,
        "input_ids": token_ids | wrong,
        "model": wrong,
    },
)


def _dumps(obj: Any) -> bytes:
    # the stdlib writes NaN/Infinity literals and integers of any size, as a careless client may
    return json.dumps(obj, allow_nan=True).encode()


# Strategies are built once: one built inside a draw is validated anew every time (slow).
_depth = st.integers(min_value=1, max_value=5000)
_brackets = st.sampled_from([("[", "]"), ('{"a":', "}")])
_breakage = st.sampled_from(["cut", "bad-utf8", "dup", "lone-surrogate"])
_bad_utf8 = st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80\x80"])


@st.composite
def deep(draw: st.DrawFn) -> bytes:
    depth = draw(_depth)
    open_, close = draw(_brackets)
    inner = open_ * depth + "1" + close * depth
    return ('{"messages": [{"role": "user", "content": ' + inner + "}]}").encode()


@st.composite
def mangled(draw: st.DrawFn, bodies: st.SearchStrategy[Any]) -> bytes:
    """A JSON body, then broken: cut short, invalid UTF-8 spliced in, a key duplicated."""
    raw = _dumps(draw(bodies))
    how = draw(_breakage)
    at = draw(st.integers(0, len(raw)))
    if how == "cut":
        return raw[:at]
    if how == "bad-utf8":
        return raw[:at] + draw(_bad_utf8) + raw[at:]
    if how == "lone-surrogate":
        return raw[:-1] + b', "x": "\\ud800"}' if raw.endswith(b"}") else raw
    if raw.startswith(b"{") and len(raw) > 2:
        return b'{"messages": 5, "stream": "yes", ' + raw[1:]
    return raw


def _bodies(structured: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes | None]:
    as_json = structured.map(_dumps)
    return st.one_of(
        as_json,
        as_json,
        as_json,
        mangled(structured),
        any_json.map(_dumps),
        st.binary(max_size=300),
        deep(),
        st.sampled_from(
            [
                b"",
                b"null",
                b"NaN",
                b"[]",
                b'"x"',
                b"{}",
                b"1e999999",
                b"-0",
                b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": Infinity}',
                b"\xef\xbb\xbf{}",
            ]
        ),
        st.none(),
    )


BODIES = {
    "/v1/chat/completions": _bodies(chat_body | valid_chat),
    "/v1/completions": _bodies(completion_body),
    "/generate": _bodies(generate_body),
}
OTHER_BODIES = _bodies(admin_body)


header_names = st.sampled_from(
    [
        "Content-Type",
        "Accept",
        "Accept-Encoding",
        "Content-Encoding",
        "Authorization",
        "x-smetric-turn",
        "x-smetric-history-tokens",
        "Connection",
        "Expect",
        "Cookie",
        "x-request-id",
        "Origin",
        "X-Forwarded-For",
        "x-fuzz",
    ]
)
header_values = st.one_of(
    st.sampled_from(
        [
            b"application/json",
            b"application/json; charset=latin-1",
            b"text/plain",
            b"multipart/form-data; boundary=x",
            b"application/x-www-form-urlencoded",
            b"*/*",
            b"text/event-stream",
            b"gzip",
            b"deflate, br",
            b"close",
            b"keep-alive",
            b"100-continue",
            b"-1",
            b"0",
            b"99999999999999999999",
            b"Bearer x",
            b"\xff\xfe",
            b"",
        ]
    ),
    st.binary(max_size=40).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b"")),
    st.integers(min_value=0, max_value=9000).map(lambda n: b"a" * n),  # around aiohttp's 8190
)
headers = st.lists(st.tuples(header_names, header_values), max_size=4)


_tenths = st.integers(0, 9)
_generation = st.sampled_from(GENERATION)
_other = st.sampled_from(OTHER_PATHS)
_random_path = st.text(max_size=30).map(lambda t: "/" + urllib.parse.quote(t, safe="/"))
_query = st.dictionaries(
    st.sampled_from(["url", "timeout", "x", "format", ""]), st.text(max_size=20), max_size=2
).map(urllib.parse.urlencode)
_methods = st.sampled_from(METHODS)
_admin_mutation = admin_body.map(_dumps) | st.binary(max_size=100)


@st.composite
def requests(draw: st.DrawFn) -> Request:
    kind = draw(_tenths)
    bare = draw(_generation if kind < 6 else _other if kind < 9 else _random_path)
    path = bare + "?" + draw(_query) if draw(_tenths) < 2 else bare
    method = "POST" if bare in GENERATION and draw(_tenths) < 8 else draw(_methods)
    body = draw(BODIES.get(bare, OTHER_BODIES))
    if bare == "/workers" and method in ("POST", "DELETE"):
        # never a URL of the test's workers: the stack must keep both
        body, path = draw(_admin_mutation), bare
    hs = draw(headers)
    if body is not None and draw(_tenths) < 7:
        hs = [("Content-Type", b"application/json"), *hs]
    if method == "HEAD":
        body = None
    return Request(method, path, tuple(hs), body)


# The test -----------------------------------------------------------------------------------


def _inflight(stack: Stack) -> float:
    status, _, body = _get(stack.host, stack.port, "/metrics")
    assert status == 200
    return total(body.decode(), "smetric_worker_inflight")


def _check(stack: Stack, r: Request, a: Answer) -> None:
    if a.status >= 500:
        worker = a.headers.get("x-smetric-worker")
        whose = f"passed through from worker {worker}" if worker else "the router's own"
        raise AssertionError(f"{a.status} ({whose}): {a.body[:500]!r}\nfor {r.show()}")
    for p in stack.procs():
        assert p.proc.poll() is None, f"{p.name} exited with {p.proc.returncode} on {r.show()}"


def test_fuzzed_requests_get_no_5xx_and_the_router_serves_on(stack: Stack) -> None:
    client = Client(stack.host, stack.port)
    started = time.monotonic()

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,  # the same requests on every run: CI is reproducible
        database=None,
        deadline=None,
        phases=(Phase.explicit, Phase.generate, Phase.shrink),
        suppress_health_check=list(HealthCheck),
    )
    @given(requests())
    def survive(r: Request) -> None:
        _check(stack, r, client.send(r))

    survive()
    elapsed = time.monotonic() - started
    statuses = sorted(client.statuses.items())
    print(f"{client.sent} fuzzed requests in {elapsed:.1f} s; statuses {statuses}")
    assert client.sent >= EXAMPLES

    for p in stack.procs():
        log = p.log_text()
        crash = CRASH_LOG.search(log)
        assert crash is None, (
            f"{p.name} logged a crash:\n{log[max(0, crash.start() - 2000) :][:6000]}"
        )
    # It serves on: health, both workers listed and healthy, a normal chat, in-flight back to 0.
    status, _, body = _get(stack.host, stack.port, "/health")
    assert status == 200 and json.loads(body)["status"] == "ok"
    status, _, body = _get(stack.host, stack.port, "/workers")
    listed = {w["url"]: w for w in json.loads(body)["workers"]}
    assert set(listed) == set(stack.worker_urls)
    assert all(w["healthy"] for w in listed.values()), listed
    chat = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "still there?"}],
        "max_tokens": 4,
    }
    a = Client(stack.host, stack.port).send(
        Request(
            "POST", "/v1/chat/completions", (("Content-Type", b"application/json"),), _dumps(chat)
        )
    )
    assert a.status == 200, a.body
    assert json.loads(a.body)["choices"][0]["message"]["content"]
    eventually_sync(lambda: _inflight(stack) == 0, "the in-flight gauge back to 0", 10)


# What the fuzzing found, one by one ----------------------------------------------------------

JSON = (("Content-Type", b"application/json"),)
HELLO = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}


def _send(
    stack: Stack,
    method: str,
    path: str,
    hs: tuple[tuple[str, bytes], ...] = JSON,
    body: bytes | None = None,
) -> Answer:
    return Client(stack.host, stack.port).send(Request(method, path, hs, body))


def _error_code(a: Answer) -> str:
    return str(json.loads(a.body)["error"]["code"])


def test_an_expect_header_that_is_not_utf8_gets_417(stack: Stack) -> None:
    # aiohttp's own Expect handler echoed the value and failed on non-UTF-8 bytes: 500
    for path in ("/v1/chat/completions", "/health", "/no/such/path"):
        a = _send(stack, "POST", path, (*JSON, ("Expect", b"\x80")), b"{}")
        assert a.status == 417 and _error_code(a) == "expectation_failed", (path, a)
    a = _send(
        stack, "POST", "/v1/chat/completions", (*JSON, ("Expect", b"100-continue")), _dumps(HELLO)
    )
    assert a.status == 200, a.body


def test_unknown_paths_and_methods_get_404_and_405_in_openai_shape(stack: Stack) -> None:
    a = _send(stack, "GET", "/v2/nothing")
    assert a.status == 404 and _error_code(a) == "not_found"
    a = _send(stack, "DELETE", "/health")
    assert a.status == 405 and _error_code(a) == "method_not_allowed"
    assert set(a.headers["allow"].split(",")) == {"GET", "HEAD"}


def test_a_chat_message_whose_role_is_not_a_string_gets_400(stack: Stack) -> None:
    # the router's request fingerprint hashed the role: TypeError, 500
    roles: list[Any] = [[], {"a": 1}, 5, None]
    for role in roles:
        body = {"model": MODEL, "messages": [{"role": role, "content": "x"}]}
        a = _send(stack, "POST", "/v1/chat/completions", body=_dumps(body))
        assert a.status == 400, (role, a)


def test_generate_with_empty_text_gets_400(stack: Stack) -> None:
    # the emulated worker handed the engine an empty prompt: 500 from both workers (a retry)
    a = _send(stack, "POST", "/generate", body=b'{"text": ""}')
    assert a.status == 400, a


def test_a_body_that_fails_its_content_encoding_gets_400(stack: Stack) -> None:
    # reading it raised RequestPayloadError in the handler: 500 "internal router error"
    hs = (*JSON, ("Content-Encoding", b"gzip"))
    a = _send(stack, "POST", "/v1/chat/completions", hs, _dumps(HELLO))
    assert a.status == 400 and json.loads(a.body)["error"]["type"] == "invalid_request_error"


def test_an_emulated_worker_answers_400_to_a_body_that_fails_its_content_encoding(
    stack: Stack,
) -> None:
    # as the router does: it answered 500 (RequestPayloadError in its handler)
    port = stack.workers[0].ports["http"]
    hs = (*JSON, ("Content-Encoding", b"gzip"))
    for path in ("/v1/chat/completions", "/generate"):
        a = Client(stack.host, port).send(Request("POST", path, hs, _dumps(HELLO)))
        assert a.status == 400, (path, a)


def test_a_gzip_compressed_body_is_served(stack: Stack) -> None:
    # aiohttp decompresses it; the worker must not get Content-Encoding: gzip with plain bytes
    hs = (*JSON, ("Content-Encoding", b"gzip"))
    a = _send(stack, "POST", "/v1/chat/completions", hs, gzip.compress(_dumps(HELLO)))
    assert a.status == 200, a.body


def test_malformed_http_is_answered_400_without_a_traceback_in_the_log(stack: Stack) -> None:
    before = len(stack.router.log_text())
    for hs in (
        (("x-fuzz", b"a\x01b"),),
        (("Content-Type", b"a"), ("Content-Type", b"b")),
        (("x-fuzz", b"a" * 9000),),
    ):
        assert _send(stack, "GET", "/health", hs).status == 400
    _get(stack.host, stack.port, "/health")  # a request after them: their records are written
    assert "Traceback" not in stack.router.log_text()[before:]


def test_prefix_match_of_ids_the_features_refuse_gets_400(stack: Stack) -> None:
    # FeatureError escaped the handler: 500 with a traceback
    refused: tuple[list[object], ...] = ([], [[]], [2**40])
    for ids in refused:
        a = _send(stack, "POST", "/smetric/prefix_match", body=_dumps({"input_ids": ids}))
        assert a.status == 400, (ids, a)
