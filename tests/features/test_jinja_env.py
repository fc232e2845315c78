"""The Jinja environment is set up as transformers 5.19 sets up its own."""

from __future__ import annotations

import datetime

import jinja2
import pytest
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from smetric_router.features.jinja_env import compile_template, make_environment


def render(source: str, **variables: object) -> str:
    return make_environment().from_string(source).render(**variables)


def test_tojson_is_plain_json_dumps() -> None:
    value = {"b": "<é>&'", "a": [1, 2.5, None, True]}
    assert render("{{ v | tojson }}", v=value) == '{"b": "<é>&\'", "a": [1, 2.5, null, true]}'
    assert render("{{ v | tojson(ensure_ascii=True) }}", v="é") == '"\\u00e9"'
    assert render("{{ v | tojson(indent=2) }}", v=[1]) == "[\n  1\n]"
    assert render("{{ v | tojson(sort_keys=True, separators=(',', ':')) }}", v=value) == (
        '{"a":[1,2.5,null,true],"b":"<é>&\'"}'
    )


def test_globals() -> None:
    with pytest.raises(jinja2.TemplateError, match="no system"):
        render("{{ raise_exception('no system') }}")
    assert render("{{ strftime_now('%Y') }}") == str(datetime.datetime.now().year)


def test_blocks_are_trimmed_and_loops_controlled() -> None:
    source = "  {% for x in xs %}\n{% if x > 2 %}{% break %}{% endif %}{{ x }}\n  {% endfor %}\n"
    assert render(source, xs=[1, 2, 3]) == "1\n2\n"


def test_generation_block_renders_its_body() -> None:
    assert render("a{% generation %}{{ x }}b{% endgeneration %}c", x="-") == "a-bc"


def test_sandbox_keeps_the_messages_immutable() -> None:
    with pytest.raises(SecurityError):
        render("{{ messages.append(1) }}", messages=[])
    with pytest.raises(SecurityError):
        render("{{ m.update({'a': 1}) }}", m={})
    assert render("{% for k, v in m | items %}{{ k }}={{ v }}{% endfor %}", m={"a": 1}) == "a=1"


def test_templates_are_compiled_once() -> None:
    assert compile_template("{{ 1 }}") is compile_template("{{ 1 }}")


def test_the_faster_sandbox_answers_as_jinjas_own() -> None:
    mine = make_environment()
    theirs = ImmutableSandboxedEnvironment()
    objects: list[object] = [{"role": "user", "items": 1}, [], "s", 3, {"a"}, make_environment]
    names = ["role", "items", "missing", "update", "append", "pop", "format", "__class__",
             "_private", "mro", "__globals__", "func_code", "upper", "add", "keys"]  # fmt: skip
    for obj in objects:
        for name in names:
            for a, b in (
                (mine.getattr(obj, name), theirs.getattr(obj, name)),
                (mine.getitem(obj, name), theirs.getitem(obj, name)),
            ):
                assert type(a) is type(b), (obj, name, a, b)
                if not isinstance(a, jinja2.Undefined):
                    assert a == b or callable(a), (obj, name)
            value = getattr(obj, name, None)
            for _ in range(2):  # the verdict is kept after the first time
                assert mine.is_safe_attribute(obj, name, value) == theirs.is_safe_attribute(
                    obj, name, value
                )


def test_the_faster_sandbox_renders_as_jinjas_own() -> None:
    source = (
        "{% macro t(c, sep='-') %}{{ c }}{{ sep }}{{ varargs }}{% endmacro %}"
        "{% macro u(x) %}[{{ x }}]{% endmacro %}{{ u('<') }}{{ u(x='>') }}"
        "{% autoescape true %}{{ u('<') }}{% endautoescape %}"
        "{% macro w(x) %}{{ caller(x) }}{% endmacro %}{% call(y) w(1) %}({{ y }}){% endcall %}"
        "{% for m in ms %}{{ u(m['role']) }}{{ t(m['content']) }}"
        "{{ t(m.content, sep='+') }}{{ t(1, 2, 3) }}"
        "{% if m['tool_calls'] is defined %}T{% endif %}{% if m.nope is defined %}N{% endif %}"
        "{% if not loop.first %}{{ loop.previtem['role'] }}{% endif %}{{ loop.index }}"
        "{% if not loop.last %}{{ loop.nextitem.role }}{% endif %}{{ m['keys'] is defined }}"
        "{{ '{}!'.format(m['role']) }}{{ m['role'].upper() }}{% endfor %}"
    )
    ms = [{"role": "user", "content": "a"}, {"role": "tool", "content": "b", "tool_calls": []}]
    theirs = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    assert make_environment().from_string(source).render(ms=ms) == theirs.from_string(
        source
    ).render(ms=ms)
    with pytest.raises(SecurityError):
        render("{% macro t() %}{% endmacro %}{{ t.__call__.__globals__ }}{{ ''.mro() }}")
