"""`file://` only inside the directories the operator configured. A path is judged after resolving
it (`..` and every symlink followed), so neither `..` nor a symlink can leave a root; a source
directory is walked and each entry judged the same way, since the engine reads files inside it."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlsplit

from engine.errors import ConvgateError


class OutsideRootsError(ConvgateError, ValueError):
    """A local path is not inside any allowed file root."""

    code = "uri.outside_roots"


def file_uri_path(uri: str) -> Path:
    """The path a plain path or a `file://` URI names (a URI with a host part is refused), judged in its
    decoded form: no file system call takes a NUL byte (`%00`), nor a lone surrogate."""
    try:
        parts = urlsplit(uri)
    except ValueError as exc:  # a malformed IPv6 host: not a path of this machine either
        raise OutsideRootsError("not a valid file URI") from exc
    if parts.scheme and parts.scheme != "file":
        raise OutsideRootsError(f"{parts.scheme}:// is not a local file URI")
    if parts.scheme and parts.netloc not in ("", "localhost"):
        raise OutsideRootsError(f"file:// URIs name local paths, not host {parts.netloc!r}")
    path = unquote(parts.path) if parts.scheme else uri
    if "\x00" in path:
        raise OutsideRootsError("a local path may not hold a NUL byte (%00)")
    if not _is_unicode(path):
        raise OutsideRootsError("a local path may not hold a lone surrogate")
    return Path(path)


def _is_unicode(text: str) -> bool:
    """False for a string holding a lone surrogate (which no file name can be encoded from)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def is_plain_relative(name: str) -> bool:
    """A name that stays inside the directory it is joined to: relative, without `..`, no backslash."""
    path = PurePosixPath(name)
    return bool(name) and "\\" not in name and not path.is_absolute() and ".." not in path.parts


def inside(path: Path, roots: Iterable[Path]) -> Path:
    """`path` resolved, when it lies inside one of `roots` (each resolved too); else OutsideRootsError."""
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError, ValueError) as exc:  # a symlink loop, a NUL, a name too long
        raise OutsideRootsError(f"{path} cannot be resolved") from exc
    for root in roots:
        if resolved.is_relative_to(root.resolve()):
            return resolved
    # Neither the roots nor where `path` resolves to: the submitter learns nothing of the server's files.
    raise OutsideRootsError(f"{path} is outside the allowed file roots")


def check_tree(directory: Path, roots: Iterable[Path]) -> None:
    """Every entry under `directory`, symlinks included, resolves inside a root."""
    roots = tuple(roots)
    for parent, dirs, files in os.walk(directory):
        for name in (*dirs, *files):
            inside(Path(parent) / name, roots)
