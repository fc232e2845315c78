"""Command-line flags declared once, on the fields of the frozen dataclass they set.

A field's metadata holds its `Flag` (`option(default, Flag(...))`): the flag's name, its help and
the few things its type cannot say. `add_flags` turns a dataclass's fields into argparse
arguments, the type from the annotation and the default from the dataclass; `values` reads the
parsed namespace back into field values. A field holding another settings dataclass
(`field(default_factory=..., metadata=nested())`) contributes that one's flags. So a setting is
written once: the parser, the mapping, --help (`DefaultsHelpFormatter`) and the reference tables
in docs/ (`markdown`) all come from its declaration.

What the flags mean for the program stays with the dataclass (its __post_init__ checks); the
command line only adds what a shell needs: a flag per field, `--no-x` for a setting on by
default, an environment variable for a secret.
"""

from __future__ import annotations

import argparse
import os
import re
import types
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import MISSING, Field, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

T = TypeVar("T")

_KEY = "smetric_router.flag"
# Types a command-line string converts to directly; anything else needs Flag.parse or .convert.
_SCALARS: tuple[type, ...] = (str, int, float, Path)


@dataclass(frozen=True, slots=True)
class Flag:
    """How one field reads from the command line."""

    name: str
    help: str
    aliases: tuple[str, ...] = ()
    metavar: str | tuple[str, ...] | None = None
    # A function is called when the parser is built: a registry may fill after the dataclass is.
    choices: Sequence[str] | Callable[[], Sequence[str]] | None = None
    group: str | None = None  # the argument group's title (add_flags' `groups` describe them)
    # The default as --help and the docs state it, where the value itself says too little
    # (None for "ask the workers").
    default_text: str | None = None
    # An absent flag takes this environment variable (empty = unset): a command line is visible
    # to every local user (ps), the environment is not. The parser's default stays None, so
    # --help never prints the value.
    env: str | None = None
    # An absent flag is None in the namespace (the field still gets its default): for a check
    # that must know whether the flag was given.
    unset: bool = False
    hidden: bool = False
    nargs: int | str | None = None  # a tuple field takes "*" values unless this says otherwise
    repeat: bool = False  # a tuple field: the flag is repeated, each use adding its value(s)
    # One command-line string -> a value, instead of the annotation's type.
    parse: Callable[[str], Any] | None = None
    # The parsed value -> the field's (may raise ValueError); by default a list becomes a tuple.
    convert: Callable[[Any], Any] | None = None
    scale: float = 1.0  # field = flag x scale, e.g. 1e-3 for a field in seconds given in ms


@dataclass(frozen=True, slots=True)
class Nested:
    """A field holding another settings dataclass, whose flags (all, or `only` these fields')
    are this one's."""

    only: frozenset[str] | None = None


def option(default: T, flag: Flag, *, repr: bool = True) -> T:
    """A dataclass field with a default, set by `flag`."""
    return field(default=default, metadata={_KEY: flag}, repr=repr)


def nested(only: Collection[str] | None = None) -> dict[str, Nested]:
    """Metadata of a field holding settings of its own (`field(default_factory=..., metadata=
    nested())`): their flags set it."""
    return {_KEY: Nested(None if only is None else frozenset(only))}


@dataclass(frozen=True, slots=True)
class _Arg:
    """A flagged field with what its annotation says."""

    field: Field[Any]
    flag: Flag
    kind: Any  # the value's type; a tuple field's item type
    is_tuple: bool
    literals: tuple[str, ...] | None

    @property
    def default(self) -> Any:
        if self.field.default is not MISSING:
            return self.field.default
        assert self.field.default_factory is not MISSING, self.field.name
        return self.field.default_factory()

    @property
    def is_bool(self) -> bool:
        return self.kind is bool and not self.is_tuple

    def to_flag(self, value: Any) -> Any:
        """A field value as the parser holds it."""
        if self.is_tuple:
            return list(value)
        if self.flag.scale != 1 and isinstance(value, int | float):
            return value / self.flag.scale
        return value

    def to_field(self, value: Any) -> Any:
        if self.flag.convert is not None:
            return self.flag.convert(value)
        if self.is_tuple:
            return tuple(value)
        if self.flag.scale != 1 and value is not None:
            return value * self.flag.scale
        return value

    def parse(self, text: str) -> Any:
        if self.flag.parse is not None:
            return self.flag.parse(text)
        return self.kind(text) if self.kind in _SCALARS else text


def _resolve(tp: Any) -> tuple[Any, bool, tuple[str, ...] | None]:
    """(value type, is a tuple[X, ...], Literal values) of an annotation, Optional dropped."""
    if get_origin(tp) in (Union, types.UnionType):
        rest = [a for a in get_args(tp) if a is not type(None)]
        tp = rest[0] if len(rest) == 1 else str
    if get_origin(tp) is Literal:
        values = tuple(str(v) for v in get_args(tp))
        return str, False, values
    if get_origin(tp) is tuple:
        args = get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            kind, _, literals = _resolve(args[0])
            return kind, True, literals
    return tp, False, None


def _declared(
    cls: type[Any], only: frozenset[str] | None = None
) -> Iterator[tuple[Field[Any], Any]]:
    """Each flagged field of `cls` (or of `only` these) with its metadata and type."""
    hints = get_type_hints(cls)
    for f in fields(cls):
        meta = f.metadata.get(_KEY)
        if meta is not None and (only is None or f.name in only):
            yield f, hints[f.name]


def _walk(cls: type[Any], only: frozenset[str] | None = None) -> Iterator[_Arg]:
    for f, tp in _declared(cls, only):
        meta = f.metadata[_KEY]
        if isinstance(meta, Nested):
            yield from _walk(tp, meta.only)
        else:
            kind, is_tuple, literals = _resolve(tp)
            yield _Arg(f, meta, kind, is_tuple, literals)


def _metavar(name: str) -> str:
    return name.lstrip("-").replace("-", "_").upper()


def add_flags(
    parser: argparse.ArgumentParser,
    cls: type[Any],
    groups: Mapping[str, str | None] | None = None,
) -> None:
    """Add a flag for each flagged field of `cls` (nested ones included), dest = the field's
    name. `groups`: title -> description of the argument groups, created in this order (a flag
    names its group by title)."""
    for title, description in (groups or {}).items():
        _group(parser, title, description)
    taken = {a.dest for a in parser._actions}
    for arg in _walk(cls):
        flag, name = arg.flag, arg.field.name
        if name in taken:
            raise ValueError(f"{cls.__name__}.{name}: another flag already sets {name!r}")
        taken.add(name)
        target = parser if flag.group is None else _group(parser, flag.group, None)
        target.add_argument(flag.name, *flag.aliases, dest=name, **_argument(arg))


def _argument(arg: _Arg) -> dict[str, Any]:
    flag, default = arg.flag, arg.default
    shown = flag.default_text
    kw: dict[str, Any] = {}
    if arg.is_bool:
        if default and not flag.name.startswith("--no-"):
            raise ValueError(f"{flag.name}: a setting on by default is turned off by --no-...")
        kw["action"] = "store_false" if default else "store_true"
    else:
        given_only = flag.unset or flag.env is not None
        if given_only and shown is None and default is not None:
            shown = _shown(arg.to_flag(default))
        kw["default"] = None if given_only else arg.to_flag(default)
        # the type itself, not a wrapper: argparse names it in its errors ("invalid int value")
        kw["type"] = flag.parse or (
            arg.kind if arg.kind in _SCALARS and arg.kind is not str else None
        )
        choices = flag.choices() if callable(flag.choices) else flag.choices
        choices = choices if choices is not None else arg.literals
        if choices is not None:
            kw["choices"] = list(choices)
        if flag.metavar is not None or choices is None:
            kw["metavar"] = flag.metavar or _metavar(flag.name)
        if arg.is_tuple and flag.repeat:
            kw["action"] = "append"
            if flag.nargs is not None:
                kw["nargs"] = flag.nargs
        elif arg.is_tuple or flag.nargs is not None:
            kw["nargs"] = flag.nargs or "*"
    text = flag.help if shown is None else f"{flag.help} (default: {shown})"
    kw["help"] = argparse.SUPPRESS if flag.hidden else text.replace("%", "%%")
    return kw


def _group(
    parser: argparse.ArgumentParser, title: str, description: str | None
) -> argparse._ArgumentGroup:
    for g in parser._action_groups:
        if g.title == title:
            return g
    return parser.add_argument_group(title, description)


def values(
    cls: type[Any], ns: argparse.Namespace, only: frozenset[str] | None = None
) -> dict[str, Any]:
    """The fields of `cls` the namespace sets, by name (nested settings built); an absent flag
    whose field keeps its default is left out. Raises ValueError from a Flag.convert."""
    out: dict[str, Any] = {}
    for f, tp in _declared(cls, only):
        meta = f.metadata[_KEY]
        if isinstance(meta, Nested):
            out[f.name] = tp(**values(tp, ns, meta.only))
            continue
        kind, is_tuple, literals = _resolve(tp)
        arg = _Arg(f, meta, kind, is_tuple, literals)
        value = getattr(ns, f.name)
        if value is None and meta.env is not None:
            text = os.environ.get(meta.env)
            value = arg.parse(text) if text else None
        if value is None and (meta.unset or meta.env is not None):
            continue
        out[f.name] = arg.to_field(value)
    return out


# --help and the docs -----------------------------------------------------------------------


def _shown(value: Any) -> str | None:
    """A default as --help states it; None where it says nothing (unset, off, empty)."""
    if value is None or value is argparse.SUPPRESS or isinstance(value, bool):
        return None
    if isinstance(value, list | tuple):
        return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value) or None
    return str(value) or None


def shown_default(action: argparse.Action) -> str | None:
    """The default an option's --help ends with, unless its help already states one."""
    if action.nargs == 0 or "(default: " in (action.help or ""):
        return None
    return _shown(action.default)


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Each option's help ends with its default, where the default says something: not for
    None, an off switch or an empty list (the help says what their absence means)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        shown = shown_default(action)
        if shown is None:
            return action.help
        return f"{action.help or ''} (default: {shown.replace('%', '%%')})"


class RawDescriptionDefaultsHelpFormatter(
    argparse.RawDescriptionHelpFormatter, DefaultsHelpFormatter
):
    """DefaultsHelpFormatter with the description printed as written."""


_DEFAULT_AT_END = re.compile(r"\s*\(default: (.*)\)$", re.DOTALL)
NO_DEFAULT = "—"  # the docs' default of an option whose help states none
OFF = "off"  # ... and of a switch


def documented(parser: argparse.ArgumentParser) -> Iterator[tuple[str, list[tuple[str, str, str]]]]:
    """Per argument group, its title and its options as (invocation, default, meaning): the
    texts --help prints (without the help option and hidden flags)."""
    formatter = parser._get_formatter()
    for group in parser._action_groups:
        rows = []
        for action in group._group_actions:
            if action.help is argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
                continue
            text = " ".join(formatter._expand_help(action).split())
            m = _DEFAULT_AT_END.search(text)
            if m is not None:
                default, text = m.group(1), text[: m.start()]
            else:
                default = OFF if action.nargs == 0 else NO_DEFAULT
            rows.append((_invocation(formatter, action), default, text))
        if rows:
            yield group.title or "", rows


def _invocation(formatter: argparse.HelpFormatter, action: argparse.Action) -> str:
    """'--role, --disaggregation-mode ROLE': each name once (argparse before 3.13 repeats the
    metavar after every alias), so the docs read the same on every Python."""
    names = ", ".join(action.option_strings)
    if action.nargs == 0:
        return names
    metavar = formatter._get_default_metavar_for_optional(action)
    return f"{names} {formatter._format_args(action, metavar)}"


def markdown(parser: argparse.ArgumentParser, title: str, intro: str) -> str:
    """The parser's options as Markdown tables, one per argument group."""
    out = [f"# {title}", "", intro, ""]
    if parser.description:
        out += [md_text(" ".join(parser.description.split())), ""]
    for group_title, rows in documented(parser):
        group = next(g for g in parser._action_groups if g.title == group_title)
        out += [f"## {group_title[:1].upper()}{group_title[1:]}", ""]
        if group.description:
            out += [md_text(" ".join(group.description.split())), ""]
        out += ["| flag | default | meaning |", "|---|---|---|"]
        out += [f"| `{i}` | {md_text(d)} | {md_text(m)} |" for i, d, m in rows]
        out.append("")
    return "\n".join(out)


def md_text(text: str) -> str:
    """Plain text as Markdown (table cells included): '*' and '<' stay themselves, '|' does not
    end a cell."""
    return re.sub(r"([\\*<|])", r"\\\1", text)
