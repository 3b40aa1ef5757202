"""Replay every saved fuzz input through its target: each must end cleanly or with a `ConvgateError`
(a coded blocker or usage error), never another exception. Needs no atheris."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from fuzz.common import ALLOWED, CORPUS
from fuzz.targets import TARGETS

CASES = sorted((target, path) for target in TARGETS for path in (CORPUS / target).iterdir())


def test_every_target_has_a_corpus_of_small_files():
    assert {path.name for path in CORPUS.iterdir()} == set(TARGETS)
    for target in TARGETS:
        files = list((CORPUS / target).iterdir())
        assert len(files) >= 5, target
        assert all(path.stat().st_size <= 8192 for path in files), target


@pytest.mark.parametrize(("target", "path"), CASES, ids=[f"{t}/{p.name}" for t, p in CASES])
def test_corpus_input_ends_cleanly(target: str, path: Path) -> None:
    with contextlib.suppress(*ALLOWED):  # a coded error is a clean end; anything else fails the test
        TARGETS[target](path.read_bytes())
