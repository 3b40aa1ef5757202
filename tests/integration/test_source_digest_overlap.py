"""The source's digests are taken while the first gate reads the same files (engine/verification.py,
`TreeDigest`): one read from the disk serves both while the page cache holds it, instead of a source larger
than the cache read twice. What the report holds and in which order is unchanged (the golden reports);
these tests show the overlap itself, and that a verification which ends early stops the digest."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from engine import digests
from engine.request import LocalInputs, VerifyRequest
from engine.verification import verify
from tests.conftest import SUITE_POLICY


class CancelledError(Exception):
    """Raised from the progress callback, as a cancelled attempt's heartbeat raises."""


def test_the_source_is_digested_while_the_first_gate_runs(monkeypatch: pytest.MonkeyPatch, tiny_llama: Path) -> None:
    gate_started = threading.Event()
    seen: list[bool] = []
    digest = digests.sha256_file

    def waiting_for_the_gate(path: Path, *args, **kwargs) -> str:  # type: ignore[no-untyped-def]
        if path.name == "model.safetensors":  # a source file; before, the gates waited for every one
            seen.append(gate_started.wait(timeout=10))
        return digest(path, *args, **kwargs)

    def progress(stage: str, _done: int, _total: int) -> None:
        if stage == "storage":
            gate_started.set()

    monkeypatch.setattr(digests, "sha256_file", waiting_for_the_gate)
    report = verify(VerifyRequest(gates=frozenset({1})), LocalInputs(source=tiny_llama / "source",
                                                                     artifact=tiny_llama / "tiny-llama-F16.gguf"),
                    SUITE_POLICY, progress)
    assert seen == [True], "the source was digested before gate 1 started"
    assert report.verdict == "GO", report.blockers
    assert any(f.uri.endswith("/model.safetensors") for f in report.files)


def test_a_verification_that_ends_in_its_first_gate_stops_the_source_digest(monkeypatch: pytest.MonkeyPatch,
                                                                             tiny_llama: Path) -> None:
    """A cancelled attempt (its heartbeat raises from the progress callback) must not leave a thread reading a
    70B source for minutes after the worker has given the verification up."""
    reading = threading.Event()
    digest = digests.sha256_file

    def slow(path: Path, *args, stop=None, **kwargs) -> str:  # type: ignore[no-untyped-def]
        if path.name == "model.safetensors":
            reading.set()
            deadline = time.monotonic() + 30
            while not (stop is not None and stop.is_set()) and time.monotonic() < deadline:
                time.sleep(0.01)  # a digest of a file far larger than this fixture's
        return digest(path, *args, stop=stop, **kwargs)

    def cancelled(stage: str, _done: int, _total: int) -> None:
        if stage == "storage":
            reading.wait(timeout=10)
            raise CancelledError

    monkeypatch.setattr(digests, "sha256_file", slow)
    before = {thread.ident for thread in threading.enumerate()}
    with pytest.raises(CancelledError):
        verify(VerifyRequest(gates=frozenset({1})), LocalInputs(source=tiny_llama / "source",
                                                                artifact=tiny_llama / "tiny-llama-F16.gguf"),
               SUITE_POLICY, cancelled)
    deadline = time.monotonic() + 5
    while any(t.name == "convgate-source-digest" and t.ident not in before for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the source digest went on after the verification ended"
        time.sleep(0.01)


def test_a_source_file_the_digest_cannot_read_fails_the_verification_as_before(monkeypatch: pytest.MonkeyPatch,
                                                                                tiny_llama: Path) -> None:
    """The digest's error (an I/O error, injected: the real one needs a failing disk) reaches the caller
    from the thread, as it did when the digest ran first: no report claims a source it could not read."""
    digest = digests.sha256_file

    def failing(path: Path, *args, **kwargs) -> str:  # type: ignore[no-untyped-def]
        if path.name == "config.json":
            raise OSError(5, "Input/output error", str(path))
        return digest(path, *args, **kwargs)

    monkeypatch.setattr(digests, "sha256_file", failing)
    with pytest.raises(OSError, match="Input/output error"):
        verify(VerifyRequest(gates=frozenset({1})), LocalInputs(source=tiny_llama / "source",
                                                                artifact=tiny_llama / "tiny-llama-F16.gguf"),
               SUITE_POLICY)
