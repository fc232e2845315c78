"""Compiling a chat template in a Jinja environment set up as transformers 5.19 sets up its own
(transformers/utils/chat_template_utils.py, what SGLang 0.5.23 renders chats with):

- an ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks;
- the loopcontrols extension ({% break %}, {% continue %}) and a {% generation %} block tag
  that renders its body unchanged (transformers tracks its span only for assistant masks);
- a `tojson` filter that is plain json.dumps (no HTML escaping; ensure_ascii=False by default,
  indent / separators / sort_keys passed through);
- globals `raise_exception(message)` (a TemplateError) and `strftime_now(format)` (local time).

Two shortcuts give the sandbox's own answers faster (rendering is per request, so it counts):
its verdict on an attribute depends only on the object's type and the attribute's name, so it is
kept per (type, name); and `message.role` on a plain dict, which the sandbox answers by failing
getattr and then indexing, indexes directly when the name is not a dict attribute.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any, NoReturn, cast

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
from jinja2.sandbox import ImmutableSandboxedEnvironment


class GenerationBlock(jinja2.ext.Extension):
    """{% generation %}...{% endgeneration %}: the body, rendered as if the tags were absent."""

    tags = {"generation"}  # noqa: RUF012 (jinja2.ext.Extension declares it a class attribute)

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_body")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> Any:
        return caller()


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str) -> NoReturn:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


_DICT_ATTRIBUTES = frozenset(dir(dict))


class _Sandbox(ImmutableSandboxedEnvironment):
    """transformers' ImmutableSandboxedEnvironment, answering the same, faster."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._verdicts: dict[tuple[type, str], bool] = {}

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        key = (type(obj), attr)
        verdict = self._verdicts.get(key)
        if verdict is None:
            verdict = self._verdicts[key] = bool(super().is_safe_attribute(obj, attr, value))
        return verdict

    def getattr(self, obj: Any, attribute: str) -> Any:
        if type(obj) is dict and attribute not in _DICT_ATTRIBUTES:
            try:
                return obj[attribute]
            except KeyError:
                return self.undefined(obj=obj, name=attribute)
        return cast(Any, super().getattr(obj, attribute))


def make_environment() -> ImmutableSandboxedEnvironment:
    env = _Sandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[GenerationBlock, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@functools.lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """The compiled template (one environment per template, as transformers caches them)."""
    return make_environment().from_string(source)


def parse_template(source: str) -> jinja2.nodes.Template:
    """The template's syntax tree, parsed by the same environment."""
    return compile_template(source).environment.parse(source)
