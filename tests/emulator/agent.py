"""Tools as coding agents offer them, in each API's shape, and the checks their calls must pass."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import smetric_router

Json = dict[str, Any]

# the project's Qwen3-Coder-style template: it renders an assistant's tool calls as the model's
# own <tool_call> block, so a follow-up carrying a call can hit the cache in full
QWEN3_CODER_TEMPLATE = str(
    Path(smetric_router.__file__).parent / "assets" / "tiny_model" / "chat_template.jinja"
)
CWD = "/home/dev/project"
SYSTEM = f"You are a coding agent.\nPrimary working directory: {CWD}"
TASK = "The test in tests/test_app.py fails; find out why."

BASH: Json = {
    "name": "Bash",
    "description": "Run a shell command",
    "parameters": {
        "type": "object",
        "properties": {"command": {"type": "string"}, "timeout": {"type": "number"}},
        "required": ["command"],
        "additionalProperties": False,
    },
}
READ: Json = {
    "name": "Read",
    "description": "Read a file",
    "parameters": {
        "type": "object",
        "properties": {"file_path": {"type": "string"}, "limit": {"type": "integer"}},
        "required": ["file_path"],
        "additionalProperties": False,
    },
}
SHELL: Json = {  # Codex's: argv as an array of strings
    "name": "shell",
    "description": "Runs a command",
    "parameters": {
        "type": "object",
        "properties": {
            "command": {"type": "array", "items": {"type": "string"}},
            "workdir": {"type": "string"},
        },
        "required": ["command"],
        "additionalProperties": False,
    },
}
WRITE: Json = {
    "name": "Write",
    "description": "Write a file",
    "parameters": {
        "type": "object",
        "properties": {"file_path": {"type": "string"}, "content": {"type": "string"}},
        "required": ["file_path", "content"],
    },
}
EDIT_PATH_ONLY: Json = {  # read-shaped, but its name says it changes things
    "name": "Edit",
    "parameters": {
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
    },
}
SCHEMAS = {t["name"]: t["parameters"] for t in (BASH, READ, SHELL, WRITE, EDIT_PATH_ONLY)}
HARMLESS = {"Bash", "Read", "shell"}


def chat_tools(*tools: Json) -> list[Json]:
    return [{"type": "function", "function": t} for t in tools]


def anthropic_tools(*tools: Json) -> list[Json]:
    return [
        {
            "name": t["name"],
            "description": t.get("description", ""),
            "input_schema": t["parameters"],
        }
        for t in tools
    ]


def responses_tools(*tools: Json) -> list[Json]:
    return [{"type": "function", **t} for t in tools]


def check_arguments(name: str, arguments: Json) -> None:
    """The arguments are valid against the tool's schema (the subset the tools above use) and
    harmless: a read-only command, or a file under the working directory."""
    schema = SCHEMAS[name]
    assert name in HARMLESS, name
    props = schema["properties"]
    assert set(schema["required"]) <= set(arguments), arguments
    if schema.get("additionalProperties") is False:
        assert set(arguments) <= set(props), arguments
    for key, value in arguments.items():
        spec = props[key]
        if spec["type"] == "string":
            assert isinstance(value, str)
        elif spec["type"] == "array":
            assert isinstance(value, list) and all(isinstance(v, str) for v in value)
        elif spec["type"] in ("number", "integer"):
            assert isinstance(value, int | float)
    command = arguments.get("command")
    if command is not None:
        argv = command if isinstance(command, list) else command.split()
        assert argv[0] in ("ls", "pwd", "cat"), command
    if "file_path" in arguments:
        assert arguments["file_path"] == f"{CWD}/tests/test_app.py"
