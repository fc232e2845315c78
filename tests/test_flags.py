"""core/flags.py: a dataclass's fields -> argparse flags -> the same dataclass back."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Literal

import pytest

from smetric_router.core.flags import (
    DefaultsHelpFormatter,
    Flag,
    add_flags,
    documented,
    nested,
    option,
    values,
)


def _pair(given: list[str]) -> tuple[str, int | None]:
    if len(given) > 2:
        raise ValueError("URL [PORT]")
    return given[0], int(given[1]) if len(given) == 2 else None


@dataclass(frozen=True, slots=True)
class Inner:
    rate: float = option(0.5, Flag("--rate", "a rate"))
    hidden_from_cli: int = option(7, Flag("--not-here", "left out by `only`"))
    plain: int = 1  # no flag


@dataclass(frozen=True, slots=True)
class Toy:
    count: int = option(3, Flag("--count", "how many"))
    name: str | None = option(None, Flag("--name", "a name", default_text="the host's"))
    mode: Literal["a", "b"] = option("a", Flag("--mode", "a or b", group="modes"))
    colour: str = option("red", Flag("--colour", "a colour", choices=lambda: ["red", "blue"]))
    events: bool = option(True, Flag("--no-events", "turn events off"))
    trust: bool = option(False, Flag("--trust", "turn trust on"))
    urls: tuple[str, ...] = option((), Flag("--urls", "some URLs", metavar="URL"))
    pairs: tuple[tuple[str, int | None], ...] = option(
        (),
        Flag(
            "--pair", "URL [PORT]", nargs="+", repeat=True, convert=lambda v: tuple(map(_pair, v))
        ),
    )
    tags: tuple[str, ...] = option((), Flag("--tag", "repeatable", repeat=True))
    secret: str | None = option(None, Flag("--secret", "a key", env="TOY_SECRET"), repr=False)
    policy: str = option("x", Flag("--policy-b", "needs --trust", unset=True))
    delay_s: float = option(1.5e-3, Flag("--delay-ms", "a delay in ms", scale=1e-3))
    shared: bool = option(False, Flag("--shared", "internal", hidden=True))
    inner: Inner = field(default_factory=Inner, metadata=nested(only=("rate",)))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="toy", formatter_class=DefaultsHelpFormatter)
    add_flags(p, Toy, {"modes": "how it runs"})
    return p


def _parse(argv: list[str]) -> Toy:
    return Toy(**values(Toy, _parser().parse_args(argv)))


def test_no_flags_give_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TOY_SECRET", raising=False)
    assert _parse([]) == Toy()
    assert _parser().parse_args([]).policy is None  # unset: a check can tell it was not given


def test_every_flag_reaches_its_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TOY_SECRET", raising=False)
    got = _parse(
        ["--count", "4", "--name", "n", "--mode", "b", "--colour", "blue", "--no-events",
         "--trust", "--urls", "u1", "u2", "--pair", "p", "9", "--pair", "q", "--tag", "t1",
         "--tag", "t2", "--secret", "s", "--policy-b", "y", "--delay-ms", "2.5", "--shared",
         "--rate", "0.25"]
    )  # fmt: skip
    assert got == Toy(
        count=4, name="n", mode="b", colour="blue", events=False, trust=True, urls=("u1", "u2"),
        pairs=(("p", 9), ("q", None)), tags=("t1", "t2"), secret="s", policy="y",
        delay_s=2.5e-3, shared=True, inner=Inner(rate=0.25),
    )  # fmt: skip


def test_env_fills_an_absent_secret_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOY_SECRET", "from-env")
    assert _parse([]).secret == "from-env"
    assert _parse(["--secret", "flag"]).secret == "flag"
    monkeypatch.setenv("TOY_SECRET", "")
    assert _parse([]).secret is None  # empty = unset
    help_text = _parser().format_help()
    assert "from-env" not in help_text


def test_errors_are_argparse_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, message in (
        (["--count", "x"], "invalid int value: 'x'"),
        (["--mode", "c"], "invalid choice: 'c'"),
        (["--colour", "green"], "invalid choice: 'green'"),
        (["--not-here", "1"], "unrecognized arguments"),
    ):
        with pytest.raises(SystemExit):
            _parser().parse_args(argv)
        assert message in capsys.readouterr().err
    with pytest.raises(ValueError, match="URL"):
        values(Toy, _parser().parse_args(["--pair", "a", "1", "2"]))


def test_help_states_defaults_that_say_something() -> None:
    rows = {
        inv.split(" ")[0]: (default, text)
        for _, g in documented(_parser())
        for inv, default, text in g
    }
    assert rows["--count"] == ("3", "how many")
    assert rows["--name"] == ("the host's", "a name")  # default_text over None
    assert rows["--delay-ms"][0] == "1.5"  # in the flag's unit
    assert rows["--policy-b"][0] == "x"  # unset: still the field's default
    assert rows["--no-events"][0] == rows["--trust"][0] == "off"  # switches
    assert rows["--urls"][0] == rows["--secret"][0] == "—"
    assert "--shared" not in rows  # hidden
    groups = [title for title, _ in documented(_parser())]
    assert groups[1:] == ["modes"]


def test_declaration_mistakes_fail_when_the_parser_is_built() -> None:
    @dataclass(frozen=True)
    class OnByDefault:
        events: bool = option(True, Flag("--events", "on"))

    with pytest.raises(ValueError, match="--no-"):
        add_flags(argparse.ArgumentParser(), OnByDefault)

    p = argparse.ArgumentParser()
    p.add_argument("--count")
    with pytest.raises(ValueError, match="count"):
        add_flags(p, Toy)
