"""Parse launch_server command lines with SGLang's own ServerArgs argument parser.

Runs in the CPU SGLang environment. Reads a JSON list of argument lists (what follows
`python -m sglang.launch_server`) from stdin; prints `RESULT <json>`: per command line either
{"error": "..."} or the parsed values of a few fields.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from typing import Any, NoReturn

from smetric_router.sglang_cpu import install

install()

from sglang.srt.server_args import ServerArgs  # noqa: E402

FIELDS = ("model_path", "port", "page_size", "device", "tp_size", "kv_events_config",
          "enable_hierarchical_cache", "hicache_storage_backend", "hicache_mem_layout",
          "disaggregation_mode", "disaggregation_transfer_backend", "disaggregation_bootstrap_port",
          "enable_cache_report", "served_model_name")  # fmt: skip


class ParseError(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ParseError(message)


out: list[dict[str, Any]] = []
for argv in json.load(sys.stdin):
    parser = Parser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            ns = parser.parse_args(argv)
    except ParseError as e:
        out.append({"error": str(e)})
        continue
    out.append({f: getattr(ns, f, None) for f in FIELDS})
print("RESULT " + json.dumps(out))
