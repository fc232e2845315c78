"""Run in .venv-sglang (tests/sglang_env.run_sglang_script): the emulated model's tool calls, read
back by SGLang 0.5.23's own qwen3_coder parser (FunctionCallParser, as a worker started with
`--tool-call-parser qwen3_coder` reads a model's text), whole and streamed.

    python tests/emulator/sglang_tool_calls.py IN.json

IN.json: [{"tools": [chat tool, ...], "text": str, "name": str, "arguments_json": str,
"fragments": [[offset, name | null, delta], ...]}, ...] (the emulator's calls). For each: the
whole text parsed at once, and the text fed one character at a time to the streaming parser
(what a worker does token by token; a character is the finest a token can be), recording the
characters read when each piece came out. Prints `RESULT <json>`: per call {"whole": [name,
arguments, normal_text], "stream": [[chars read, name | null, delta], ...]}.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def main(in_path: str) -> None:
    from sglang.srt.entrypoints.openai.protocol import Tool
    from sglang.srt.function_call.function_call_parser import FunctionCallParser
    from sglang.srt.runtime_context import get_context

    get_context().override_server_args().install()  # SGLang's defaults for every server arg
    with open(in_path, encoding="utf-8") as f:
        calls: list[dict[str, Any]] = json.load(f)
    out = []
    for call in calls:
        tools = [Tool.model_validate(t) for t in call["tools"]]
        whole_text, whole = FunctionCallParser(tools, "qwen3_coder").parse_non_stream(call["text"])
        parser = FunctionCallParser(tools, "qwen3_coder")
        stream = []
        for i, ch in enumerate(call["text"]):
            _, items = parser.parse_stream_chunk(ch)
            stream += [[i + 1, item.name, item.parameters] for item in items]
        out.append({
            "whole": [[c.name, c.parameters] for c in whole],
            "normal_text": whole_text,
            "stream": stream,
        })  # fmt: skip
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
