"""`file://` only inside the directories the operator configured. A path is judged after resolving
it (`..` and every symlink followed), so neither `..` nor a symlink can leave a root; a source
directory is walked and each entry judged the same way, since the engine reads files inside it."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlsplit


class OutsideRootsError(ValueError):
    """A local path is not inside any allowed file root."""


def file_uri_path(uri: str) -> Path:
    """The path a plain path or a `file://` URI names (a URI with a host part is refused)."""
    parts = urlsplit(uri)
    if not parts.scheme:
        return Path(uri)
    if parts.scheme != "file":
        raise OutsideRootsError(f"{parts.scheme}:// is not a local file URI")
    if parts.netloc not in ("", "localhost"):
        raise OutsideRootsError(f"file:// URIs name local paths, not host {parts.netloc!r}")
    return Path(unquote(parts.path))


def is_plain_relative(name: str) -> bool:
    """A name that stays inside the directory it is joined to: relative, without `..`, no backslash."""
    path = PurePosixPath(name)
    return bool(name) and "\\" not in name and not path.is_absolute() and ".." not in path.parts


def inside(path: Path, roots: Iterable[Path]) -> Path:
    """`path` resolved, when it lies inside one of `roots` (each resolved too); else OutsideRootsError."""
    resolved = path.resolve()
    for root in roots:
        if resolved.is_relative_to(root.resolve()):
            return resolved
    shown = ", ".join(str(root) for root in roots) or "none configured"
    raise OutsideRootsError(f"{path} (resolved: {resolved}) is outside the allowed file roots ({shown})")


def check_tree(directory: Path, roots: Iterable[Path]) -> None:
    """Every entry under `directory`, symlinks included, resolves inside a root."""
    roots = tuple(roots)
    for parent, dirs, files in os.walk(directory):
        for name in (*dirs, *files):
            inside(Path(parent) / name, roots)
