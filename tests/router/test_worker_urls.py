"""Worker URLs are scheme://host[:port] only; credentials in one are refused and never echoed."""

from __future__ import annotations

import io
import logging
from contextlib import redirect_stderr

import aiohttp
import pytest

from smetric_router.router.cli import config_from_args
from smetric_router.router.workers import normalize_url
from tests.router.conftest import MakeRouter, MakeWorker

SECRET = "s3cret-pw"

BAD = [
    (f"http://user:{SECRET}@127.0.0.1:{{port}}", "credentials"),
    (f"http://{SECRET}@127.0.0.1:{{port}}", "credentials"),
    ("http://127.0.0.1:{port}/v1", "path"),
    ("http://127.0.0.1:{port}/?x=1", "query"),
    ("http://127.0.0.1:{port}#frag", "fragment"),
    ("http://127.0.0.1:{port}\r\nX-Injected: 1", "control characters"),
    ("http://127.0.0.1:{port}\x00", "control characters"),
    ("http://127.0.0.1:{port} x", "blanks"),
    ("http://127.0.0.1:99999", "port"),
]


@pytest.mark.parametrize(("url", "why"), BAD)
def test_normalize_url_refuses(url: str, why: str) -> None:
    with pytest.raises(ValueError, match=why) as e:
        normalize_url(url.format(port=8000))
    assert SECRET not in str(e.value)


@pytest.mark.parametrize(
    ("url", "normal"),
    [
        ("http://h:1/", "http://h:1"),
        (" https://h.example ", "https://h.example"),
        ("http://[::1]:30001", "http://[::1]:30001"),
    ],
)
def test_normalize_url_keeps_base_urls(url: str, normal: str) -> None:
    assert normalize_url(url) == normal


async def test_admin_api_refuses_bad_urls_with_400(
    make_worker: MakeWorker, make_router: MakeRouter, caplog: pytest.LogCaptureFixture
) -> None:
    w = await make_worker("a")
    router = await make_router([])
    port = w.url.rsplit(":", 1)[1]
    caplog.set_level(logging.DEBUG)
    async with aiohttp.ClientSession() as s:
        for url, why in BAD:
            async with s.post(router.url + "/workers", json={"url": url.format(port=port)}) as r:
                text = await r.text()
                assert r.status == 400, url
                body = await r.json()
                assert body["error"]["param"] == "url" and why in body["error"]["message"]
                assert SECRET not in text and SECRET not in str(dict(r.headers))
            async with s.delete(router.url + "/workers", json={"url": url.format(port=port)}) as r:
                assert r.status == 400 and SECRET not in await r.text()
        assert router.state.registry.workers == {}
        async with s.get(router.url + "/metrics") as r:
            assert SECRET not in await r.text()
        async with s.post(router.url + "/workers", json={"url": w.url + "/"}) as r:
            assert r.status == 200
    assert list(router.state.registry.workers) == [w.url]
    assert SECRET not in caplog.text


def test_cli_refuses_bad_urls_at_start_without_echoing_credentials() -> None:
    for url, why in BAD:
        err = io.StringIO()
        with redirect_stderr(err), pytest.raises(SystemExit):
            config_from_args(["--worker-urls", url.format(port=8000)])
        assert why in err.getvalue() and SECRET not in err.getvalue()
    err = io.StringIO()
    with redirect_stderr(err), pytest.raises(SystemExit):
        config_from_args(["--pd-disaggregation", "--prefill", f"http://u:{SECRET}@h:1",
                          "--decode", "http://h:2"])  # fmt: skip
    assert "credentials" in err.getvalue() and SECRET not in err.getvalue()
