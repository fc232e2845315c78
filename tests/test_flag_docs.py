"""docs/router-flags.md and docs/emulator-flags.md say what the programs' --help says: every flag
--help prints has a row with the same default and no row names a flag --help lacks, so a flag
added without regenerating the docs (python -m smetric_router.core.flag_docs) fails here."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from pathlib import Path

import pytest

from smetric_router.core.flag_docs import DOCS, FlagDoc
from smetric_router.emulator.__main__ import parse_args as emulator_parse_args
from smetric_router.router.cli import build_parser, main
from tests.helpers.flag_docs import disagreements, help_options, table_options

ROOT = Path(__file__).resolve().parents[1]
ROUTER_DOC = next(d for d in DOCS if d.path == "docs/router-flags.md")


@pytest.fixture(autouse=True)
def _wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    # argparse wraps help at the terminal's width, breaking words at hyphens
    monkeypatch.setenv("COLUMNS", "100000")


def _printed_help(run: Callable[[list[str]], object]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as e:
        run(["--help"])
    assert e.value.code == 0
    return out.getvalue()


def _doc(doc: FlagDoc) -> str:
    return (ROOT / doc.path).read_text()


def test_router_flag_table_is_what_help_says() -> None:
    help_text = _printed_help(main)
    assert len(help_options(help_text)) > 50  # the help was read, not skipped
    assert disagreements(help_text, _doc(ROUTER_DOC)) == []


def test_emulator_flag_table_is_what_help_says() -> None:
    doc = next(d for d in DOCS if d.path == "docs/emulator-flags.md")
    help_text = _printed_help(emulator_parse_args)
    assert len(help_options(help_text)) > 20
    assert disagreements(help_text, _doc(doc)) == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.path)
def test_docs_are_generated_from_the_current_flags(doc: FlagDoc) -> None:
    """The help texts (the meaning column) too: regenerate with
    python -m smetric_router.core.flag_docs."""
    assert _doc(doc) == doc.render(), (
        f"{doc.path} is stale: python -m smetric_router.core.flag_docs"
    )


def test_a_flag_added_without_docs_fails() -> None:
    parser = build_parser()
    parser.add_argument("--new-knob", type=int, default=3, help="a setting nobody documented")
    parser.set_defaults(max_retries=5)  # a default changed without regenerating
    problems = disagreements(parser.format_help(), _doc(ROUTER_DOC))
    assert problems == [
        "--new-knob: in --help, not in the docs",
        "--max-retries: default '5' in --help, '2' in the docs",
    ]
    # and a row left behind for a flag that is gone
    removed = "\n".join(
        line for line in _doc(ROUTER_DOC).splitlines() if "--l3-tp-rank" not in line
    )
    assert disagreements(build_parser().format_help(), removed) == [
        "--l3-tp-rank: in --help, not in the docs"
    ]


def test_tables_read_every_name_and_escaped_default() -> None:
    doc = "\n".join(
        [
            "| `--role ROLE, --disaggregation-mode ROLE` | null | x |",
            "| `--flag` | off | y \\| z |",
            "| `--key KEY` | $K, else a \\| b | w |",
        ]
    )
    assert table_options(doc) == {
        "--role": "null",
        "--disaggregation-mode": "null",
        "--flag": "off",
        "--key": "$K, else a | b",
    }
