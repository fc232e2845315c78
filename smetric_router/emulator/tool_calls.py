"""When and how the emulated model calls a tool: harmless calls that let an agent loop end.

The emulated model is Qwen3-Coder, served as by SGLang with `--tool-call-parser qwen3_coder`: a
call is the text the model writes (a `<tool_call>` block, then the end of turn), and the reply
carries what SGLang's qwen3_coder detector parses out of it. The rule, stateless and reproducible:

- only tools the request offers and allows are called (tool_choice "none" forbids calls; a named
  choice allows that tool only), and only harmless ones: a shell-like tool (its one required
  property `command` or `cmd`, a string or an array of strings, besides an optional required
  string `description`) runs `ls`, `pwd` or `cat FILE`; a read-like tool (its one required
  property `file_path`, `filePath` or `path`, a string) reads FILE. A tool whose name says it
  writes, edits, spawns agents or goes to the web is never called;
- FILE is the first file path named in the conversation's user text (outside Claude Code's
  `<system-reminder>` blocks), joined to the working directory the prompt names (Claude Code's
  "Primary working directory: /abs", Codex's `<cwd>/abs</cwd>`) when relative; else README.md;
- a session makes k tool rounds, k in 1..3 drawn from its first user message: an answer is a call
  while the conversation holds fewer than k tool results; tool_choice "required" (Anthropic
  "any") or a named tool makes every answer a call. The answer after the k-th result is text, so
  an agent's run (`claude -p`, `codex exec`) ends by itself.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

Json = dict[str, Any]
MAX_ROUNDS = 3
_SHELL_KEYS = ("command", "cmd")
_PATH_KEYS = ("file_path", "filePath", "path")
# never called: tools that change things or reach out, and image viewers (a text file is an error
# there: Codex's view_image takes a `path` like a file reader)
_UNSAFE = ("write", "edit", "agent", "task", "web", "fetch", "patch", "notebook", "delete",
           "remove", "create", "move", "rename", "kill", "image")  # fmt: skip
_CWD = re.compile(r"(?:Primary working directory|Working directory):\s*(/\S+)|<cwd>([^<]+)</cwd>")
_REMINDER = re.compile(r"<system-reminder>.*?</system-reminder>", re.DOTALL)
_PATH = re.compile(
    r"(?<![\w/.:-])((?:\.{0,2}/)?(?:[\w.-]+/)*[\w-]*[A-Za-z][\w-]*\.[A-Za-z][A-Za-z0-9]{1,7})"
    r"(?![\w/-])"
)
DEFAULT_FILE = "README.md"


@dataclass(frozen=True)
class Call:
    """One call of a tool, as the model writes it and as SGLang's parser reports it."""

    name: str
    arguments: Json  # in the order the model writes them

    @property
    def text(self) -> str:
        """Qwen3-Coder's call block: non-string values written as JSON, as its chat template
        renders them (so a follow-up that carries the call re-renders the same text)."""
        out = f"<tool_call>\n<function={self.name}>\n"
        for key, value in self.arguments.items():
            written = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            out += f"<parameter={key}>\n{written}\n</parameter>\n"
        return out + "</function>\n</tool_call>"

    @property
    def arguments_json(self) -> str:
        """function.arguments as SGLang's detector writes it."""
        return json.dumps(self.arguments, ensure_ascii=False)

    def fragments(self) -> list[tuple[int, str | None, str]]:
        """The streamed pieces of the call as SGLang's streaming qwen3_coder detector emits them:
        (characters of `text` it needs, the name on the first piece, an arguments delta)."""
        text = self.text
        head = text.index(">", text.index("<function=")) + 1
        out: list[tuple[int, str | None, str]] = [(head, self.name, "")]
        pos = head
        for i, (key, value) in enumerate(self.arguments.items()):
            pos = text.index("</parameter>", pos) + len("</parameter>")
            if i == 0:
                out.append((pos, None, "{"))
            pair = f"{json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}"
            out.append((pos, None, pair if i == 0 else ", " + pair))
        end = text.index("</function>", pos) + len("</function>")
        if not self.arguments:
            out.append((end, None, "{"))
        out.append((end, None, "}"))
        return out


def call_id() -> str:
    """SGLang's id of a call it parsed (chat tool_calls, Anthropic tool_use, Responses call_id)."""
    return f"call_{uuid.uuid4().hex[:24]}"


def plan_call(chat: Json, allowed: Iterable[str] | None = None) -> Call | None:
    """The call this chat body's answer is, or None for a text answer. allowed: the tool names
    that may be called (None: all function tools), e.g. a Responses body's function tools."""
    choice = chat.get("tool_choice", "auto")
    tools = [t for t in chat.get("tools") or [] if isinstance(t, dict)]
    if not tools or choice == "none":
        return None
    names = None if allowed is None else set(allowed)
    if isinstance(choice, dict):
        named = str((choice.get("function") or {}).get("name"))
        names = {named} if names is None or named in names else set()
    messages = [m for m in chat.get("messages") or [] if isinstance(m, dict)]
    seed = _session_seed(messages)
    results = sum(m.get("role") == "tool" for m in messages)
    forced = choice == "required" or isinstance(choice, dict)
    if not forced and results >= 1 + seed % MAX_ROUNDS:
        return None
    options = _options(tools, names, _mentioned_file(messages))
    if not options:
        return None
    call: Call = options[(seed // MAX_ROUNDS + results) % len(options)]
    return call


def _session_seed(messages: Sequence[Json]) -> int:
    first = next((m for m in messages if m.get("role") == "user"), None)
    h = hashlib.blake2b(digest_size=8)
    h.update(_text(first.get("content") if first else None).encode())
    return int.from_bytes(h.digest(), "little")


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = (p for p in content if isinstance(p, dict) and p.get("type") == "text")
        return "\n".join(str(p.get("text", "")) for p in parts)
    return ""


def _mentioned_file(messages: Sequence[Json]) -> str:
    cwd = None
    for m in messages:
        found = _CWD.search(_text(m.get("content")))
        if found:
            cwd = (found.group(1) or found.group(2)).strip().rstrip("/.,")
            break
    path = DEFAULT_FILE
    for m in messages:
        if m.get("role") != "user":
            continue
        found = _PATH.search(_REMINDER.sub("", _text(m.get("content"))))
        if found:
            path = found.group(1)
            break
    if cwd and not path.startswith("/"):
        path = f"{cwd}/{path.removeprefix('./')}"
    return path


def _options(tools: Sequence[Json], names: set[str] | None, file: str) -> list[Call]:
    """The harmless calls the offered tools allow, reads of the file first."""
    reads: list[Call] = []
    shells: list[Call] = []
    for tool in tools:
        fn = tool.get("function", tool)
        name = fn.get("name")
        if tool.get("type", "function") != "function" or not isinstance(name, str):
            continue
        if (names is not None and name not in names) or any(w in name.lower() for w in _UNSAFE):
            continue
        params = fn.get("parameters") or {}
        props = params.get("properties") or {}
        required = [r for r in params.get("required") or [] if isinstance(r, str)]
        if not isinstance(props, dict):
            continue
        key = _only(required, props, _PATH_KEYS, ("string",))
        if key is not None:
            reads.append(Call(name, {key: file}))
            continue
        key = _only(required, props, _SHELL_KEYS, ("string", "array"), extra=("description",))
        if key is None:
            continue
        as_list = props[key].get("type") == "array"
        for argv, what in ((["cat", file], "Show a file"), (["ls"], "List files"),
                           (["pwd"], "Show the working directory")):  # fmt: skip
            args: Json = {key: argv if as_list else shlex.join(argv)}
            if "description" in required:
                args["description"] = what
            shells.append(Call(name, args))
    return reads + shells


def _only(
    required: Sequence[str],
    props: Json,
    keys: Sequence[str],
    types: Sequence[str],
    extra: Sequence[str] = (),
) -> str | None:
    """The one of `keys` the tool requires (besides string `extra` ones), if its type fits."""
    mine = [r for r in required if r in keys]
    others = [r for r in required if r not in keys]
    if len(mine) != 1 or any(r not in extra or not _is(props.get(r), "string") for r in others):
        return None
    spec = props.get(mine[0])
    if not isinstance(spec, dict) or "enum" in spec:
        return None
    kind = spec.get("type")
    if kind == "array":
        items = spec.get("items")
        return mine[0] if "array" in types and _is(items, "string") else None
    return mine[0] if kind in types else None


def _is(spec: object, kind: str) -> bool:
    return isinstance(spec, dict) and spec.get("type") == kind and "enum" not in spec
