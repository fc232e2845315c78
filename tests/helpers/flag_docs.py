"""Reading a program's flags back from what people read: the options its --help prints and the
rows of its reference table in docs/, each as flag -> the default it states, so that the two can
be compared without trusting the code that renders either."""

from __future__ import annotations

import re

OFF = "off"  # the default a docs table states for a switch
NONE = "—"  # ... and for an option whose help states none

_DEFAULT = re.compile(r"\(default: (.*)\)$")


def _names(invocation: str) -> tuple[list[str], bool]:
    """'--role ROLE, --disaggregation-mode ROLE' -> the option's names, and whether it takes a
    value."""
    parts = invocation.split(", ")
    return [p.split(" ")[0] for p in parts], any(" " in p for p in parts)


def help_options(help_text: str) -> dict[str, str]:
    """Each option --help lists (under each of its names; not -h) -> the default its help ends
    with, else OFF for a switch and NONE for an option. Read from unwrapped help (a terminal
    wide enough that no line wraps: wrapping breaks words at hyphens)."""
    blocks: list[list[str]] = []
    open_block = False
    for line in help_text.splitlines():
        if line.startswith("  -"):
            blocks.append([line])
            open_block = True
        elif open_block and line.startswith("    "):
            blocks[-1].append(line)
        else:
            open_block = False
    out: dict[str, str] = {}
    for block in blocks:
        first = re.split(r"\s{2,}", block[0].strip(), maxsplit=1)
        names, takes_value = _names(first[0])
        if "-h" in names:
            continue
        text = " ".join(" ".join([*first[1:], *block[1:]]).split())
        m = _DEFAULT.search(text)
        default = m.group(1) if m else (NONE if takes_value else OFF)
        for name in names:
            out[name] = default
    return out


def table_options(markdown: str) -> dict[str, str]:
    """Each flag a docs table has a row for (under each of its names) -> its default column."""
    out: dict[str, str] = {}
    for line in markdown.splitlines():
        if not line.startswith("| `-"):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        names, _ = _names(cells[0].strip("`"))
        default = re.sub(r"\\(.)", r"\1", cells[1])
        for name in names:
            out[name] = default
    return out


def disagreements(help_text: str, markdown: str) -> list[str]:
    """Where --help and the docs table differ: a flag only in one, or a different default."""
    in_help, in_docs = help_options(help_text), table_options(markdown)
    problems = [f"{n}: in --help, not in the docs" for n in in_help if n not in in_docs]
    problems += [f"{n}: in the docs, not in --help" for n in in_docs if n not in in_help]
    problems += [
        f"{n}: default {in_help[n]!r} in --help, {in_docs[n]!r} in the docs"
        for n in in_help
        if n in in_docs and in_help[n] != in_docs[n]
    ]
    return problems
