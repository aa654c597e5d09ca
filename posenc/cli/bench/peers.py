"""Which peer libraries are installed, for the benches that time posenc against them."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping


def installed(dist: str) -> bool:
    """Whether the distribution ``dist`` (a pip name) is installed."""
    try:
        importlib.metadata.version(dist)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def versions(dists: Mapping[str, str]) -> dict[str, str]:
    """``{row name: version}`` of the installed ones among ``dists`` (``{row name: pip name}``)."""
    out = {}
    for name, dist in dists.items():
        try:
            out[name] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out
