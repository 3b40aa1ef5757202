"""llama.cpp cannot take the verifier down: it runs in a child process, and a death there is a verdict.

The faults are real where llama.cpp produces them: a GGUF whose `llama.block_count` is far larger than its
tensors makes llama.cpp abort (SIGABRT) while loading, and a private-memory cap below what the model
needs makes the load fail inside the child. A segfault and a hang cannot be produced on demand by a
file we know of, so those two are injected by signalling the child from the test (named as such).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from engine.runtime import llama_process
from engine.runtime.llama_candidate import CandidateLoadError
from engine.runtime.llama_process import LlamaCrashedError, LlamaProcess
from tests.conftest import codes, run_gates
from tests.gguf_rewrite import rewrite

pytestmark = pytest.mark.slow


def _huge_block_count(tiny_llama: Path, tmp_path: Path) -> Path:
    return rewrite(tiny_llama / "tiny-llama-F16.gguf", tmp_path / "blocks.gguf", set_keys={"llama.block_count": 4096})


def test_llama_cpp_aborting_on_a_file_ends_the_child_not_the_verifier(tiny_llama, tmp_path):
    """The file the issue names, handed to the loader directly: SIGABRT in the child, named."""
    with pytest.raises(LlamaCrashedError) as caught:
        LlamaProcess(_huge_block_count(tiny_llama, tmp_path), embedding=False, n_ctx=64)
    assert "SIGABRT" in str(caught.value) and caught.value.during == "loading the model"


def test_block_count_contradicting_the_tensors_is_no_go_without_loading(tiny_llama, tmp_path, monkeypatch):
    """Gates 2 and 3 never hand a file whose metadata contradicts its tensors to llama.cpp."""
    started: list[Path] = []
    original = LlamaProcess.__init__

    def spy(self, path, **kwargs):  # type: ignore[no-untyped-def]
        started.append(path)
        original(self, path, **kwargs)

    monkeypatch.setattr(LlamaProcess, "__init__", spy)
    report = run_gates(tiny_llama / "source", _huge_block_count(tiny_llama, tmp_path), {2, 3})
    assert report.verdict == "NO-GO"
    assert codes(report) == {"runtime.refused_to_load"}, report.blockers
    assert {b.key for b in report.blockers} == {"llama.block_count"}
    assert {b.gate for b in report.blockers} == {"runtime", "release"}
    assert not started


def test_a_crash_during_gate_2_is_a_no_go_named_by_its_signal(tiny_llama, monkeypatch):
    """Injected (no known file segfaults this build on demand): the child gets SIGSEGV mid-gate."""
    original = LlamaProcess.submit_logits_rows

    def segfault(self, segments):  # type: ignore[no-untyped-def]
        os.kill(self._process.pid, signal.SIGSEGV)
        return original(self, segments)

    monkeypatch.setattr(LlamaProcess, "submit_logits_rows", segfault)
    report = run_gates(tiny_llama / "source", tiny_llama / "tiny-llama-F16.gguf", {2})
    assert report.verdict == "NO-GO"
    assert codes(report) == {"runtime.crashed"}, report.blockers
    assert "SIGSEGV" in report.blockers[0].why and "computing logits" in report.blockers[0].why


def test_a_hang_is_killed_at_the_deadline_and_named(tiny_llama, monkeypatch):
    """Injected: the child is stopped (SIGSTOP) so it never answers; the deadline kills it."""
    monkeypatch.setattr(llama_process, "CALL_TIMEOUT_S", 2.0)
    with LlamaProcess(tiny_llama / "tiny-llama-F16.gguf", embedding=False, n_ctx=64) as candidate:
        os.kill(candidate._process.pid, signal.SIGSTOP)
        with pytest.raises(LlamaCrashedError) as caught:
            candidate.tokenize("hello", add_special=True, parse_special=False)
    assert "did not answer within 2 s" in str(caught.value)


def test_a_memory_cap_below_the_models_need_fails_inside_the_child(tiny_llama):
    """A real allocation failure: the cap (RLIMIT_DATA) is below what the context needs."""
    with pytest.raises((CandidateLoadError, LlamaCrashedError)):
        LlamaProcess(tiny_llama / "tiny-llama-F16.gguf", embedding=False, n_ctx=2048, memory_limit=64 * 2**20)


def test_the_verifier_survives_and_answers_after_a_child_dies(tiny_llama):
    with LlamaProcess(tiny_llama / "tiny-llama-F16.gguf", embedding=False, n_ctx=64) as first:
        os.kill(first._process.pid, signal.SIGKILL)
        with pytest.raises(LlamaCrashedError, match="SIGKILL"):
            first.tokenize("hello", add_special=True, parse_special=False)
    with LlamaProcess(tiny_llama / "tiny-llama-F16.gguf", embedding=False, n_ctx=64) as second:
        assert second.tokenize("hello", add_special=True, parse_special=False)
