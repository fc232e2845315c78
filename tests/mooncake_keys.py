"""What tests of emulated workers on a real Mooncake master (tests/mooncake_master.py) look up:
SGLang's page keys, whether a store holds them, and the environment the launcher gives a worker."""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Sequence
from typing import Any

import pytest

from tests.helpers.prometheus import metric
from tests.mooncake_master import Master, master_binary, store_client


def require_mooncake() -> str:
    """The master binary, once Mooncake's client library also imports (it needs libibverbs1);
    skips without them, fails under SMETRIC_REQUIRE_SGLANG."""
    binary = master_binary()
    try:
        import mooncake.store  # noqa: F401
    except (ImportError, OSError) as exc:
        why = f"Mooncake's store client does not import ({exc}): apt-get install libibverbs1"
        if os.environ.get("SMETRIC_REQUIRE_SGLANG"):
            pytest.fail(why)
        pytest.skip(why)
    return binary


def client_env(master: Master, segment_bytes: int) -> dict[str, str]:
    """The MOONCAKE_* environment the launcher gives a worker (launch.kinds.sglang.mooncake_env)."""
    return {
        "MOONCAKE_MASTER": master.rpc_address,
        "MOONCAKE_TE_META_DATA_SERVER": master.metadata_url,
        "MOONCAKE_PROTOCOL": "tcp",
        "MOONCAKE_DEVICE": "",
        "MOONCAKE_GLOBAL_SEGMENT_SIZE": str(segment_bytes),
        "MOONCAKE_LOCAL_HOSTNAME": "127.0.0.1",
        "MC_TCP_BIND_ADDRESS": "127.0.0.1",
    }


def pure_client(master: Master) -> Any:
    """A client that lends the store nothing, as the router's view of L3 would."""
    return store_client(master, segment_bytes=0)


def capacity(master: Master) -> float:
    """The bytes the workers lend the store (the master's master_total_capacity_bytes)."""
    return metric(master.url, "master_total_capacity_bytes")


def sglang_page_keys(model: str, token_ids: Sequence[int], page_size: int) -> list[str]:
    """SGLang's MooncakeStore keys of the full pages of token_ids (MHA, TP rank 0), written out
    here from SGLang's scheme rather than taken from the code under test: page i's digest is
    SHA-256(digest i-1 || its tokens as little-endian uint32); its keys are
    `<model, '/' -> '-'>_<digest hex>_0_k` and `_v`."""
    prefix = model.replace("/", "-")
    digest, keys = b"", []
    for at in range(0, len(token_ids) // page_size * page_size, page_size):
        page = token_ids[at : at + page_size]
        digest = hashlib.sha256(digest + struct.pack(f"<{page_size}I", *page)).digest()
        keys += [f"{prefix}_{digest.hex()}_0_k", f"{prefix}_{digest.hex()}_0_v"]
    return keys


def pages_present(store: Any, keys: list[str]) -> list[int]:
    """Per page (K, V key pairs): 1 when both objects exist."""
    exist = store.batch_is_exist(keys)
    return [int(exist[i] == 1 and exist[i + 1] == 1) for i in range(0, len(keys), 2)]
