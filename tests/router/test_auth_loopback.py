"""router/auth.py's parts: admin endpoints without any key are for loopback clients only (a test
server binds 127.0.0.1 only, so the peer address is mocked); the start-up line names no key."""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest
from aiohttp.test_utils import make_mocked_request

from smetric_router.router.auth import AuthPolicy, check_admin, describe
from smetric_router.router.errors import RouterError


def _request(method: str, path: str, peer: str, headers: dict[str, str] | None = None) -> Any:
    transport = mock.Mock()
    transport.get_extra_info.side_effect = lambda name, default=None: (
        (peer, 40000) if name == "peername" else default
    )
    return make_mocked_request(method, path, headers=headers, transport=transport)


@pytest.mark.parametrize("peer", ["127.0.0.1", "127.8.0.1", "::1", "::ffff:127.0.0.1"])
def test_without_any_key_admin_is_open_to_loopback(peer: str) -> None:
    check_admin(AuthPolicy(), _request("POST", "/flush_cache", peer))


@pytest.mark.parametrize("peer", ["10.1.2.3", "192.168.0.7", "fd00::1", "::ffff:10.0.0.1", ""])
def test_without_any_key_admin_refuses_other_clients(peer: str) -> None:
    forwarded = {"X-Forwarded-For": "127.0.0.1"}  # a header anyone can send proves nothing
    with pytest.raises(RouterError) as e:
        check_admin(AuthPolicy(), _request("POST", "/flush_cache", peer, forwarded))
    assert e.value.status == 403 and "loopback" in e.value.message


def test_start_up_line_says_what_is_guarded_and_shows_no_key() -> None:
    assert describe(AuthPolicy()) == (
        "inference endpoints: open; admin endpoints: loopback clients only; to workers: none"
    )
    keyed = AuthPolicy(api_key="k-1", admin_api_key="k-2", worker_api_key="k-3")
    line = describe(keyed)
    assert line == "inference endpoints: key; admin endpoints: admin key; to workers: worker key"
    assert "k-" not in line and "k-1" not in repr(keyed)
    assert "inference key" in describe(AuthPolicy(api_key="k", forward_authorization=True))
