"""--api-key-file: strict decoding with the field's path in each error, keys from the
environment, duplicates refused, --api-key as tenant "default", keys never in a message."""

from __future__ import annotations

from pathlib import Path

import pytest

from smetric_router.admission.buckets import Limits
from smetric_router.admission.tenants import (
    KeyFileError,
    Tenant,
    TenantTable,
    load_tenants,
    parse_key_file,
)
from smetric_router.router.cli import config_from_args

SECRET = "sk-secret-0123456789"

GOOD = """
tenants:
  - name: team-a
    key_env: TEAM_A_KEY
    requests_per_minute: 600
    tokens_per_minute: 2000000
    weight: 3
    max_priority: 10
  - name: batch
    key: sk-batch-1
"""


def test_a_yaml_key_file_with_keys_from_the_environment() -> None:
    a, b = parse_key_file(GOOD, {"TEAM_A_KEY": SECRET})
    assert a == Tenant("team-a", SECRET, Limits(600, 2000000), 3.0, 10)
    assert b == Tenant("batch", "sk-batch-1")
    assert SECRET not in repr(a)


def test_json_is_read_too() -> None:
    (t,) = parse_key_file('{"tenants": [{"name": "j", "key": "k1", "weight": 0.5}]}', {})
    assert (t.name, t.weight, t.limits) == ("j", 0.5, Limits())


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("tenants:\n  - {name: a, key: k, colour: red}",
         "unknown field `colour` - at `tenants[0]`"),
        ("tenants:\n  - {name: a, key: 12345}",
         "Expected `str | null`, got `int` - at `tenants[0].key`"),
        ("tenants:\n  - {name: a, key: k, weight: heavy}", "got `str` - at `tenants[0].weight`"),
        ("tenants:\n  - {name: a, key: k, weight: 0}", "> 0.0 - at `tenants[0].weight`"),
        ("tenants:\n  - {name: a, key: k}\n  - {name: b, key: k, requests_per_minute: -1}",
         "at `tenants[1].requests_per_minute`"),
        ("tenants:\n  - {name: a, key: k, max_priority: 1.5}", "at `tenants[0].max_priority`"),
        ("tenants:\n  - {name: 'a b', key: k}", "at `tenants[0].name`"),
        ("tenants:\n  - {key: k}", "missing required field `name` - at `tenants[0]`"),
        ("tenant: []", "unknown field `tenant`"),
        ("- {name: a, key: k}", "Expected `object`, got `array`"),
        ("tenants: []", "lists no tenant"),
        ("tenants:\n  - {name: a}", "tenants[0] (a): give exactly one of `key` and `key_env`"),
        ("tenants:\n  - {name: a, key: k, key_env: E}", "give exactly one"),
        ("tenants:\n  - {name: a, key_env: UNSET_VAR}", "UNSET_VAR is not set"),
        ("tenants:\n  - {name: a, key: 'two words'}", "printable ASCII without blanks"),
        ("tenants:\n  - {name: a, key: k1}\n  - {name: a, key: k2}", "name 'a' appears twice"),
        ("tenants:\n  - {name: a, key: k1}\n  - {name: b, key: k1}", "'b' has the same key"),
    ],
)  # fmt: skip
def test_bad_files_name_what_is_wrong_and_where(text: str, says: str) -> None:
    with pytest.raises(KeyFileError) as e:
        TenantTable(parse_key_file(text, {}, "keys.yaml"))
    assert says in str(e.value)


def test_a_syntax_error_does_not_quote_the_file() -> None:
    with pytest.raises(KeyFileError) as e:
        parse_key_file(f"tenants:\n  - name: a\n    key: {SECRET}\n   : [", {})
    assert "line" in str(e.value) and SECRET not in str(e.value)


def test_the_api_key_joins_as_tenant_default(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text("tenants:\n  - {name: a, key: k1}")
    table = load_tenants(str(path), api_key="k0")
    assert table.names == ("a", "default")
    found = table.identify("k0")
    assert found is not None and found.name == "default" and found.limits == Limits()
    with pytest.raises(KeyFileError) as e:
        load_tenants(str(path), api_key="k1")
    assert "the --api-key is tenant 'default'" in str(e.value)
    assert "k1" not in str(e.value).replace("keys.yaml", "")


def test_identify_finds_the_tenant_or_none() -> None:
    table = TenantTable([Tenant("a", "k1"), Tenant("b", "k2")])
    assert [table.identify(k) for k in ("k1", "k2")] == list(table)
    assert table.identify("k3") is None and table.identify("") is None
    assert table.weights() == {"a": 1.0, "b": 1.0}


def test_a_bad_key_file_is_a_usage_error(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text("tenants:\n  - {name: a, key: k, weight: -2}")
    with pytest.raises(SystemExit) as e:
        config_from_args(["--api-key-file", str(path)])
    assert e.value.code == 2
    with pytest.raises(SystemExit):
        config_from_args(["--api-key-file", str(tmp_path / "missing.yaml")])
