"""Reusing an earlier render's loop iterations gives exactly the template's own text."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from smetric_router.features.chat_tokenizer import load_chat_tokenizer
from smetric_router.features.jinja_env import make_environment
from smetric_router.features.loop_reuse import Loops, Whole, reusing_template
from smetric_router.features.rendered import common_prefix

ASSETS = Path(__file__).resolve().parents[2] / "smetric_router" / "assets"
TEMPLATES = {
    "chatml": None,
    "coder": str(ASSETS / "tiny_model" / "chat_template.jinja"),
    "thinking": str(Path(__file__).parent / "templates" / "qwen3_thinking.jinja"),
}
PATH = {"type": "object", "properties": {"path": {"type": "string"}}}
TOOLS = [
    {"type": "function", "function": {"name": "read", "description": "Read", "parameters": PATH}}
]


def message(rng: random.Random, i: int) -> dict[str, Any]:
    role = rng.choice(["user", "assistant", "assistant", "tool", "tool", "system"])
    content = rng.choice(["", "hi", f"text {i}", "<think>r</think>a", f"line\n{i}\n"])
    out: dict[str, Any] = {"role": role, "content": content}
    if role == "assistant" and rng.random() < 0.6:
        args = {"path": f"f{i}.py", "n": rng.choice([1, 1.0, True, [1, "x"], {"b": 1, "a": 2}])}
        out["tool_calls"] = [{"id": f"c{i}", "type": "function",
                              "function": {"name": "read", "arguments": args}}]  # fmt: skip
    if role == "assistant" and rng.random() < 0.3:
        out["reasoning_content"] = f"why {i}"
    return out


def conversation(rng: random.Random) -> list[list[dict[str, Any]]]:
    """Successive message lists of one conversation: each extends the previous one's objects
    (as chat_prompt reuses them), sometimes with its last messages replaced."""
    messages = [{"role": "system", "content": "sys"}] if rng.random() < 0.7 else []
    out: list[list[dict[str, Any]]] = []
    for step in range(12):
        if out and rng.random() < 0.2:
            messages = messages[: rng.randint(0, len(messages))]
        messages = messages + [message(rng, 100 * step + k) for k in range(rng.randint(1, 3))]
        out.append(messages)
    return out


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_renders_and_shared_prefixes_equal_the_templates_own(name: str) -> None:
    chat = load_chat_tokenizer(None, TEMPLATES[name])
    assert chat._reusing is not None  # each of these templates has a loop that qualifies
    for seed in range(30):
        rng = random.Random(seed)
        base: Loops | None = None
        source: Whole | None = None
        for messages in conversation(rng):
            tools = TOOLS if rng.random() < 0.5 else None
            kwargs = {"enable_thinking": False} if rng.random() < 0.3 else {}
            try:
                expected = chat.render(messages, tools, kwargs, True)
            except ValueError:
                continue
            text, loops = chat.render_reusing(messages, tools, kwargs, True, base, source)
            assert text == expected
            history = messages[: rng.randint(1, len(messages))]
            try:
                shown = chat.render(history, tools, kwargs, False)
            except ValueError:
                continue
            assert chat.shared_prefix(history, tools, kwargs, False, loops, text) == (
                common_prefix(shown, text)
            )
            if rng.random() < 0.9:
                base, source = loops, Whole(text)


def reuses(source: str, **variables: Any) -> bool:
    """Whether a second render of the same variables reuses the first one's iterations."""
    template = reusing_template(make_environment(), source)
    if template is None:
        return False
    expected = make_environment().from_string(source).render(**variables)
    text, loops = template.render(variables, None, None)
    again, _ = template.render(variables, loops, Whole(text))
    assert text == again == expected
    recorder = template._run(variables, loops, Whole(text))
    return bool(recorder.runs)


def test_what_qualifies() -> None:
    items = [{"a": 1}, {"a": 2}, {"a": 3}]
    assert reuses("{% for m in ms %}{{ m.a }}{{ loop.index }}{% endfor %}", ms=items)
    assert reuses(
        "{% if x %}{% for m in ms %}{{ m.a }}{{ x }}{% endfor %}{% endif %}", ms=items, x=1
    )
    assert reuses(
        "{% for m in ms %}{% if loop.nextitem %}{{ m.a }}{% endif %}{% endfor %}", ms=items
    )
    # iterations that affect each other or read what changes unseen
    assert not reuses(
        "{% for m in ms %}{% if m.a > 1 %}{% break %}{% endif %}{% endfor %}", ms=items
    )
    assert not reuses(
        "{% set ns = namespace(n=0) %}{% for m in ms %}{% set ns.n = ns.n + m.a %}{{ ns.n }}"
        "{% endfor %}",
        ms=items,
    )
    assert not reuses("{% for m in ms %}{{ loop.cycle('a', 'b') }}{% endfor %}", ms=items)
    assert not reuses("{% for m in ms %}{{ strftime_now('%Y') }}{% endfor %}", ms=items)
    assert not reuses("{% for m in ms %}{{ [1, 2] | random }}{% endfor %}", ms=items)
    assert not reuses("{% for m in ms %}{% for n in ms %}{{ n.a }}{% endfor %}{% endfor %}", ms=[])
    # in a macro the loop is not at the top level
    macro = "{% macro f() %}{% for m in ms %}{{ m.a }}{% endfor %}{% endmacro %}{{ f() }}"
    assert not reuses(macro, ms=items)


def test_values_read_from_outside_are_compared_strictly() -> None:
    source = "{% for m in ms %}{{ m.a }}{{ d | tojson }}{{ f }}{% endfor %}"
    template = reusing_template(make_environment(), source)
    assert template is not None
    items = [{"a": 1}, {"a": 2}]
    plain = make_environment().from_string(source)
    first, loops = template.render({"ms": items, "d": {"x": 1, "y": 2}, "f": 1}, None, None)
    for d, f in (({"y": 2, "x": 1}, 1), ({"x": 1, "y": 2}, 1.0), ({"x": 1, "y": 2}, True)):
        text, _ = template.render({"ms": items, "d": d, "f": f}, loops, Whole(first))
        assert text == plain.render(ms=items, d=d, f=f)
