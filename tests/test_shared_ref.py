"""A test needing ../shared skips without it locally and fails where it is required (CI)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.shared_ref import ENV_REQUIRE, SHARED, require_shared


@pytest.mark.parametrize(
    ("env", "fails"),
    [({}, False), ({ENV_REQUIRE: "1"}, True), ({"CI": "true"}, True), ({"CI": "false"}, False)],
)
def test_missing_shared_reference_skips_or_fails(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, env: dict[str, str], fails: bool
) -> None:
    for name in (ENV_REQUIRE, "CI"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    missing = tmp_path / "not-there.json"
    outcome = pytest.fail.Exception if fails else pytest.skip.Exception
    with pytest.raises(outcome, match=r"not-there\.json is missing"):
        require_shared(missing)
    assert require_shared(tmp_path) == tmp_path


def test_shared_is_beside_the_repository() -> None:
    assert Path(__file__).resolve().parents[2] / "shared" == SHARED
