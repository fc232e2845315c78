"""The emulated model's tool calls are what a real SGLang worker with `--tool-call-parser
qwen3_coder` reports for that text: SGLang's own parser reads the emulator's call text (the
arguments exactly as the emulator answers them) and streams the same pieces at the same points."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from smetric_router.emulator.tool_calls import Call, plan_call
from smetric_router.launch.kinds.sglang import CPU_SITE
from tests.emulator.agent import BASH, READ, SHELL, SYSTEM, chat_tools
from tests.sglang_env import REPO, run_sglang_script

pytestmark = pytest.mark.sglang

SCRIPT = Path(__file__).with_name("sglang_tool_calls.py")
TASKS = [f"Task {i}: the test in tests/test_{i}.py fails; see src/mod_{i}.py." for i in range(12)]
# values a model may write: quotes, backslashes, newlines inside a value, non-ASCII, numbers
ODD = [
    Call("shell", {"command": ["cat", 'a "b" \\c.txt'], "workdir": "/tmp/ü ñ"}),
    Call("Bash", {"command": "printf 'x\\ny'\n  | wc -l", "timeout": 30}),
    Call("Read", {"file_path": "/p/\u6587\u4ef6.md", "limit": 25}),
]


def _planned() -> list[tuple[list[dict[str, Any]], Call]]:
    out = []
    for tools in ([BASH, READ], [SHELL], [READ]):
        for task in TASKS:
            chat = {"messages": [{"role": "system", "content": SYSTEM},
                                 {"role": "user", "content": task}],
                    "tools": chat_tools(*tools)}  # fmt: skip
            call = plan_call(chat)
            assert call is not None, (tools, task)
            out.append((chat["tools"], call))
    return out


def test_sglang_parses_the_emulated_calls_as_the_emulator_answers_them(tmp_path: Path) -> None:
    cases = _planned() + [(chat_tools(BASH, READ, SHELL), c) for c in ODD]
    assert len({c.text for _, c in cases}) > 6  # the plans differ: ls, pwd, cat, Read of files
    given = [{"tools": tools, "text": c.text} for tools, c in cases]
    (tmp_path / "in.json").write_text(json.dumps(given), encoding="utf-8")
    env = {"SMETRIC_SGLANG_CPU": "1", "PYTHONPATH": os.pathsep.join((str(CPU_SITE), str(REPO)))}
    got = run_sglang_script(SCRIPT, str(tmp_path / "in.json"), env=env)
    for (_, call), parsed in zip(cases, got, strict=True):
        assert parsed["whole"] == [[call.name, call.arguments_json]], (call.text, parsed)
        assert parsed["normal_text"] == "", parsed
        want = [[at, name, delta] for at, name, delta in call.fragments()]
        assert parsed["stream"] == want, (call.text, parsed["stream"], want)
