"""Where the SGLang to patch is installed, and its version, found without importing SGLang."""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "sglang"


class TargetError(RuntimeError):
    """SGLang is not installed where we looked, or its version cannot be read."""


@dataclass(frozen=True)
class Target:
    site_dir: Path  # the directory holding the ``sglang/`` package (patch paths are relative to it)
    version: str | None  # from the ``sglang-*.dist-info`` beside the package; None if absent


def _version_in(site_dir: Path) -> str | None:
    for dist in importlib.metadata.distributions(path=[str(site_dir)]):
        if (dist.metadata["Name"] or "").lower() == PACKAGE:
            return dist.version
    return None


def from_site_dir(site_dir: Path) -> Target:
    """An explicit directory holding ``sglang/`` (e.g. another environment's site-packages)."""
    site_dir = site_dir.resolve()
    if not (site_dir / PACKAGE / "__init__.py").is_file():
        raise TargetError(f"{site_dir} holds no {PACKAGE}/ package")
    return Target(site_dir=site_dir, version=_version_in(site_dir))


def find_installed() -> Target:
    """The SGLang this interpreter would import. ``find_spec`` of a top-level name locates the
    package without running its ``__init__`` (importing sglang takes seconds and needs torch)."""
    try:
        spec = importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError) as exc:
        raise TargetError(f"cannot locate {PACKAGE}: {exc}") from exc
    if spec is None:
        raise TargetError(
            f"{PACKAGE} is not installed in this Python environment; run the command with the "
            "environment's interpreter (e.g. .venv-sglang/bin/python -m smetric_router.patches)"
        )
    if spec.submodule_search_locations:
        package_dir = Path(next(iter(spec.submodule_search_locations)))
    elif spec.origin:
        package_dir = Path(spec.origin).parent
    else:
        raise TargetError(f"cannot tell where {PACKAGE} is installed (spec {spec!r})")
    return from_site_dir(package_dir.parent)
