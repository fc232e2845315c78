"""Worker kind `emulated`: the emulated SGLang worker (smetric_router.emulator), a test and
benchmark tool with a modelled H20 engine, started with this interpreter. With `global_tier:
mooncake` every worker that has HiCache in SGLang (not a PD decode) keeps its L3 in the spec's
Mooncake master (`--global-tier mooncake`), set up from the same MOONCAKE_* environment a real
SGLang worker gets, and publishes KV events for the pages it writes there (`--l3-kv-events`), as
the SGLang this project builds does with its l3-events patch: what a router's `--l3-view events`
reads."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from itertools import count, repeat
from pathlib import Path

from smetric_router.launch.kinds.base import WorkerLaunch
from smetric_router.launch.kinds.sglang import mooncake_env
from smetric_router.launch.spec import ClusterSpec
from smetric_router.launch.tiny_model import TEMPLATE


def chat_template_args(spec: ClusterSpec) -> tuple[str, ...]:
    """`--chat-template PATH` for the workers and the router alike (none: the tokenizer's)."""
    name = spec.workers.chat_template
    if name == "tokenizer":
        return ()
    path = TEMPLATE if name == "qwen3-coder" else Path(name)
    if not path.is_file():
        raise ValueError(
            f"workers.chat_template: {name!r} is neither qwen3-coder, tokenizer nor a file"
        )
    return ("--chat-template", str(path))


def plan(spec: ClusterSpec) -> list[WorkerLaunch]:
    """The workers of a spec, with their ports: consecutive from workers.base_port, else 0 (each
    worker binds free ports and reports them through --port-file: see launch.stack)."""
    w, pd = spec.workers, spec.pd
    reports = w.base_port == 0
    ports: Iterator[int] = repeat(0) if reports else count(w.base_port)

    def port() -> int:
        return next(ports)

    python = (sys.executable, "-m", "smetric_router.emulator")
    common = ("--host", "127.0.0.1", "--model-name", w.model_name, "--page-size",
              str(w.page_size), "--profile", w.profile, "--speedup", str(w.speedup),
              *chat_template_args(spec))  # fmt: skip

    def kv_events() -> tuple[str, ...]:
        return ("--kv-events-port", str(port()), "--kv-events-replay-port", str(port()))

    l3: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    if spec.mooncake is not None:
        # announcing what they write, as this project's SGLang (patched: `make sglang`) does
        l3 = ("--global-tier", "mooncake", "--l3-kv-events")
        env = tuple(mooncake_env(spec.mooncake, "127.0.0.1").items())

    def launch(name: str, http: int, argv: tuple[str, ...], role: str = "null",
               bootstrap: int | None = None) -> WorkerLaunch:  # fmt: skip
        url = f"http://127.0.0.1:{http}"
        return WorkerLaunch(name, url, argv, role, bootstrap, env=env if role != "decode" else (),
                            reports_ports=reports)  # fmt: skip

    out = []
    if pd is None:
        for i in range(w.count):
            http = port()
            argv = (*python, "--port", str(http), *common, *kv_events(), *l3, *w.extra_args)
            out.append(launch(f"worker-{i}", http, argv))
        return out
    for i in range(pd.prefill):
        http = port()
        events = kv_events()
        bootstrap = port()
        argv = (*python, "--port", str(http), *common, *events,
                "--role", "prefill", "--disaggregation-bootstrap-port", str(bootstrap), *l3,
                *w.extra_args, *pd.prefill_extra_args)  # fmt: skip
        out.append(launch(f"prefill-{i}", http, argv, "prefill", bootstrap))
    for i in range(pd.decode):
        # no KV events: a decode instance's cache is not what the router routes by; no L3:
        # SGLang's decode runs without HiCache
        http = port()
        argv = (*python, "--port", str(http), *common, "--role", "decode",
                "--transfer-gbps", str(pd.transfer_gbps),
                "--decode-kv-timeout-secs", str(pd.decode_kv_timeout_secs),
                *w.extra_args, *pd.decode_extra_args)  # fmt: skip
        out.append(launch(f"decode-{i}", http, argv, "decode"))
    return out
