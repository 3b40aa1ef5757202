"""Local files against a statement's subjects: each file is matched to the subject whose name ends
with the most of the file's path components (subjects are named by URI, a recipient holds copies
elsewhere), and its sha256 must equal that subject's."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlsplit

from engine.digests import sha256_file
from service.attestations.statement import Statement, Subject
from service.attestations.vsa import VsaStatement


def _parts(name: str) -> tuple[str, ...]:
    path = unquote(urlsplit(name).path) if "://" in name else name
    return PurePosixPath(path).parts


def _shared_tail(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    shared = 0
    while shared < min(len(a), len(b)) and a[-1 - shared] == b[-1 - shared]:
        shared += 1
    return shared


def subject_for(statement: Statement | VsaStatement, path: Path) -> Subject | str:
    """The one subject `path` stands for, or why there is none."""
    local = path.absolute().parts
    scored = [(_shared_tail(_parts(s.name), local), s) for s in statement.subject]
    best = max(score for score, _ in scored)  # the schema requires a subject
    if best == 0:
        return f"{path}: no subject is named {path.name!r}"
    matches = [s for score, s in scored if score == best]
    if len(matches) > 1:
        return f"{path}: several subjects end with {path.name!r} ({', '.join(s.name for s in matches)})"
    return matches[0]


def check_subjects(statement: Statement | VsaStatement, paths: Sequence[Path]) -> list[str]:
    """One line per local file that is missing, unnamed or differs from its subject; empty when all match."""
    problems = []
    for path in paths:
        subject = subject_for(statement, path)
        if isinstance(subject, str):
            problems.append(subject)
            continue
        if not path.is_file():
            problems.append(f"{path}: not a readable file")
            continue
        actual = sha256_file(path)
        if actual != subject.digest.sha256:
            problems.append(f"{path}: sha256 {actual} differs from subject {subject.name} ({subject.digest.sha256})")
    return problems
