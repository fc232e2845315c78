"""Discovery flags -> settings, and the one-line errors for flags that do not fit together."""

from __future__ import annotations

from pathlib import Path

import pytest

from smetric_router.discovery.file import FileFormatError, FileSettings, parse_workers
from smetric_router.discovery.kubernetes import KubeSettings
from smetric_router.router.cli import config_from_args
from smetric_router.router.workers import Role


def test_kubernetes_flags_as_smg_names_them() -> None:
    c = config_from_args(
        ["--service-discovery", "--selector", "app=sglang", "tier=gpu",
         "--service-discovery-namespace", "inference", "--service-discovery-port", "30000"]
    )  # fmt: skip
    s = c.discovery_settings()
    assert isinstance(s, KubeSettings)
    assert s.namespace == "inference" and s.rules.port == 30000
    assert s.list_selector.query() == "app=sglang,tier=gpu"
    same = config_from_args(["--discovery-provider", "kubernetes", "--selector", "app=sglang"])
    t = same.discovery_settings()
    assert isinstance(t, KubeSettings)
    assert t.namespace is None and t.rules.port == 8000  # all namespaces, smg's port


def test_pd_selectors_and_static_workers_beside_discovery() -> None:
    c = config_from_args(
        ["--pd-disaggregation", "--service-discovery", "--prefill-selector", "app=s,role=p",
         "--decode-selector", "app=s", "role=d", "--bootstrap-port-annotation", "x/bootstrap"]
    )  # fmt: skip
    s = c.discovery_settings()
    assert isinstance(s, KubeSettings) and s.rules.pd
    assert s.rules.bootstrap_annotation == "x/bootstrap"
    assert s.list_selector.query() == "app=s"  # what both roles carry: filtered by the API
    static = config_from_args(
        ["--worker-urls", "http://10.0.0.1:8000", "--service-discovery", "--selector", "app=s"]
    )
    assert static.worker_specs()[0].url == "http://10.0.0.1:8000"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--service-discovery"], "needs --selector"),
        (["--service-discovery", "--selector", "app"], "--selector takes key=value"),
        (["--service-discovery", "--selector", "app!=x"], "--selector takes key=value"),
        (["--selector", "app=x"], "--selector need --service-discovery"),
        (["--service-discovery", "--selector", "a=b", "--prefill-selector", "r=p"],
         "need --pd-disaggregation"),
        (["--pd-disaggregation", "--service-discovery", "--selector", "a=b"],
         "needs --prefill-selector"),
        (["--service-discovery", "--discovery-provider", "file", "--selector", "a=b"],
         "cannot be combined"),
        (["--service-discovery", "--selector", "a=b", "--service-discovery-port", "0"],
         "1..65535"),
        (["--service-discovery", "--selector", "a=b", "--service-discovery-namespace", "Bad_NS"],
         "not a namespace"),
        (["--discovery-provider", "file"], "needs --discovery-file"),
        (["--discovery-file", "w.yaml"], "needs --discovery-provider file"),
        (["--pd-disaggregation"], "at least one --prefill"),
    ],
)  # fmt: skip
def test_bad_combinations_are_one_line_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        config_from_args(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert message in err and err.startswith("smetric-router: error:")


def test_file_provider_settings_and_pd_discovery_without_static_workers() -> None:
    c = config_from_args(
        ["--pd-disaggregation", "--discovery-provider", "file", "--discovery-file", "w.json"]
    )
    assert c.discovery_settings() == FileSettings(Path("w.json"), pd=True, interval_secs=1.0)


def test_discovery_file_format() -> None:
    got = parse_workers('[{"url": "http://10.0.0.1:8000"}, "http://10.0.0.2:8000/"]')
    assert list(got) == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    pd = parse_workers(
        "workers:\n- {url: 'http://p:1', role: prefill, bootstrap_port: 8998}\n"
        "- {url: 'http://d:1', role: decode}\n",
        pd=True,
    )
    assert pd["http://p:1"].spec.role is Role.PREFILL
    assert pd["http://p:1"].spec.bootstrap_port == 8998
    assert parse_workers("") == {}
    for bad, message in (
        ("{url: x}", "must hold a list"),
        ("[{url: 'http://a:1', role: prefill}]", "'role' must be absent"),
        ("[{host: a}]", "unknown keys"),
        ("['http://a:1', 'http://a:1']", "listed twice"),
        ("['ftp://a']", "http://host:port"),
        ("[unclosed", "neither JSON nor YAML"),
    ):
        with pytest.raises(FileFormatError, match=message):
            parse_workers(bad)
    with pytest.raises(FileFormatError, match="'prefill' or 'decode'"):
        parse_workers("['http://a:1']", pd=True)
