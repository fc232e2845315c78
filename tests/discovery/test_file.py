"""The discovery file read poll by poll: a change is taken once two reads agree on it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry

from smetric_router.discovery.base import Added, Change
from smetric_router.discovery.file import FileProvider, FileSettings
from smetric_router.discovery.metrics import DiscoveryMetrics

A, B = "http://10.0.0.1:8000", "http://10.0.0.2:8000"


class Applied:
    def __init__(self) -> None:
        self.batches: list[list[tuple[str, str]]] = []

    async def __call__(self, changes: Sequence[Change]) -> None:
        self.batches.append(
            [("add" if isinstance(c, Added) else "remove", c.worker.url) for c in changes]
        )


def _provider(path: Path) -> FileProvider:
    return FileProvider(FileSettings(path), DiscoveryMetrics(CollectorRegistry()))


async def test_a_save_caught_half_way_is_not_applied(tmp_path: Path) -> None:
    path = tmp_path / "workers.yaml"
    path.write_text(f"- {A}\n")
    provider, applied = _provider(path), Applied()
    await provider.poll(applied)  # the first read is the start-up list: taken at once
    assert applied.batches == [[("add", A)]]
    path.write_text("")  # truncated: the editor has not written the new content yet
    await provider.poll(applied)
    path.write_text(f"- {A}\n- {B}\n")
    await provider.poll(applied)  # a new content once: not yet
    assert applied.batches == [[("add", A)]]
    await provider.poll(applied)  # read again the same: taken
    assert applied.batches == [[("add", A)], [("add", B)]]
    await provider.poll(applied)
    assert len(applied.batches) == 2


async def test_an_emptied_file_removes_its_workers_once_it_stays_empty(tmp_path: Path) -> None:
    path = tmp_path / "workers.yaml"
    path.write_text(f"- {A}\n")
    provider, applied = _provider(path), Applied()
    await provider.poll(applied)
    path.write_text("")
    await provider.poll(applied)
    await provider.poll(applied)
    assert applied.batches == [[("add", A)], [("remove", A)]]
