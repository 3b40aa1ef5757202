"""Installed package versions, for reports that must name the software a verdict came from."""

from __future__ import annotations

from importlib import metadata


def package_version(package: str) -> str | None:
    """The installed distribution's version, or None when it is not installed (callers word that)."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None
