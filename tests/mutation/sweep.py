"""Run every twin of an honest fixture through the verifier and count what is caught."""

from __future__ import annotations

import multiprocessing
import os
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from engine.policy import Policy
from engine.verification import LocalInputs, VerifyRequest, verify
from tests.mutation import gguf_edit
from tests.mutation.twins import Twin, caught, explain, metadata_twins, tensor_twins

# The honest fixtures twinned: embedding and causal LM, float and quantized, three tokenizer families.
FIXTURES = {
    "qwen3-embedding-F32": ("tiny-qwen3", "tiny-qwen3-F32.gguf"),
    "qwen3-embedding-Q8_0": ("tiny-qwen3", "tiny-qwen3-Q8_0.gguf"),
    "llama-causal-F16": ("tiny-llama", "tiny-llama-F16.gguf"),
    "llama-causal-Q4_K_M": ("tiny-llama", "tiny-llama-Q4_K_M.gguf"),
    "bert-embedding-F16": ("minilm", "minilm-F16.gguf"),
    "bert-embedding-Q8_0": ("minilm", "minilm-Q8_0.gguf"),
}
PROBE_TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "How do I verify that a converted model matches the original weights?",
    "Numbers 7 42 365 2026 3.14159 and 1,000,000; I've, you're, they'll, we'd.",
    "Tabs\tand  double  spaces,\nnewlines\n\nand ALL CAPS or MiXeD case!",
)


@dataclass(frozen=True)
class Outcome:
    twin: Twin
    caught: bool
    verdict: str
    explanation: str


def run_twin(source: Path, twin: Twin, workdir: Path) -> tuple[bool, str, str]:
    """Gate 1 first; the twin's other gates only when gate 1 alone did not catch it. A gate only ever adds
    blockers, so a twin gate 1 catches is caught by the full run too, and gate 2 (two transformers models
    and a llama.cpp child per twin) runs where it is the evidence. Returns (caught, verdict, explanation)."""
    path = gguf_edit.write(twin.gguf, workdir / "twin.gguf")
    report = verify(VerifyRequest(gates=frozenset({1})), LocalInputs(source=source, artifact=path), Policy())
    if twin.gates != {1} and not caught(twin, report):
        request = VerifyRequest(gates=twin.gates, texts=PROBE_TEXTS if 2 in twin.gates else None)
        report = verify(request, LocalInputs(source=source, artifact=path), Policy())
    path.unlink()
    return caught(twin, report), report.verdict, explain(report)


def twins_of(artifact: Path, sample: int | None, seed: int) -> list[Twin]:
    """All metadata twins; every tensor (sample=None) or `sample` tensors chosen with `seed`."""
    honest = gguf_edit.read(artifact)
    return [*metadata_twins(honest, seed), *tensor_twins(honest, sample, seed)]


_TWINS: list[Twin] = []  # a pool process's own copy: twins are rebuilt there, never pickled across


def _load_twins(artifact: Path, sample: int | None, seed: int) -> None:
    _TWINS[:] = twins_of(artifact, sample, seed)


def _run_one(source: Path, index: int, workdir: Path) -> tuple[bool, str, str]:
    folder = workdir / f"twin-{index}"
    folder.mkdir()
    return run_twin(source, _TWINS[index], folder)


def sweep(source: Path, artifact: Path, workdir: Path, sample: int | None, seed: int = 0,
          workers: int = min(2, os.cpu_count() or 1)) -> list[Outcome]:
    """Every twin of `artifact` through the verifier, `workers` at a time (gate 1 runs on one core)."""
    twins = twins_of(artifact, sample, seed)
    spawn = multiprocessing.get_context("spawn")  # the parent holds llama.cpp and torch threads: no fork
    with ProcessPoolExecutor(workers, mp_context=spawn, initializer=_load_twins,
                             initargs=(artifact, sample, seed)) as pool:
        results = pool.map(_run_one, [source] * len(twins), range(len(twins)), [workdir] * len(twins))
        return [Outcome(twin, *result) for twin, result in zip(twins, results, strict=True)]


def tally(outcomes: list[Outcome]) -> dict[str, Counter[str]]:
    counts: dict[str, Counter[str]] = {}
    for outcome in outcomes:
        counts.setdefault(outcome.twin.kind, Counter())["caught" if outcome.caught else "missed"] += 1
    return counts
