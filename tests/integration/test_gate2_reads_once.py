"""Gate 2 reads each weight of a streamed reference once per run, however many texts it measures.

A reference larger than RESIDENT_BYTES is streamed: each module's weights are read just before it runs and
dropped after. Run one text at a time, a 70B source (140 GB, beyond any pod's page cache) would be read from
disk once per text. Streamed references run all of a run's sequences in one padded batch instead, so every
checkpoint key is read as often for eight texts as for one. Both trained models are streamed here (the limit
forced to 0) and must still be GO: batching must not move the reference's numbers.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from engine.runtime import streamed_model as streamed_module
from engine.runtime.artifact_weights import ArtifactCheckpoint
from engine.runtime.checkpoints import SafetensorsCheckpoint
from tests.conftest import SUITE_POLICY, run_gates

pytestmark = pytest.mark.slow

EIGHT = ("The quick brown fox jumps over the lazy dog.",
         "How do I verify that a converted model matches the original weights?",
         "Paris is the capital and largest city of France.",
         "Photosynthesis lets plants turn light, water and carbon dioxide into sugar and oxygen.",
         "def add(a, b):\n    return a + b",
         "Der schnelle braune Fuchs springt über den faulen Hund.",
         "1, 2, 3, 5, 8, 13, 21, 34, 55",
         "Platform teams gate every model before it ships.")


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[tuple[int, str]]]:
    """Every checkpoint key each streamed reference (one `Loading` each) reads, counted."""
    counted: Counter[tuple[int, str]] = Counter()
    load = streamed_module.Loading.load

    def counting(self: streamed_module.Loading, keys: Sequence[str]) -> set[str]:
        counted.update((id(self), key) for key in keys)
        return load(self, keys)

    monkeypatch.setattr(streamed_module, "RESIDENT_BYTES", 0)
    monkeypatch.setattr(streamed_module.Loading, "load", counting)
    yield counted


def per_key(counted: Counter[tuple[int, str]]) -> list[int]:
    """How often each key was read, per reference, in a stable order (references by first read)."""
    order = list(dict.fromkeys(reference for reference, _ in counted))
    return [counted[(reference, key)] for reference in order
            for key in sorted(key for owner, key in counted if owner == reference)]


@pytest.mark.parametrize(("fixture", "artifact"), [("smollm2", "smollm2-BF16.gguf"), ("minilm", "minilm-F16.gguf")])
def test_eight_texts_read_each_weight_as_often_as_one(fixture: str, artifact: str, reads: Counter,
                                                       request: pytest.FixtureRequest) -> None:
    root: Path = request.getfixturevalue(fixture)
    short = SUITE_POLICY.model_copy(update={"long_context_tokens": 256})  # reads, not positions, are counted
    one = run_gates(root / "source", root / artifact, {2}, short, texts=EIGHT[:1])
    once = per_key(reads)
    reads.clear()
    eight = run_gates(root / "source", root / artifact, {2}, short, texts=EIGHT)
    assert one.verdict == "GO" and eight.verdict == "GO", (one.blockers, eight.blockers)
    # each weight is read once per length group (HFModel.prefetch): a causal LM's long text is
    # one group, and texts of similar lengths share one, so eight short texts of 1-13 words cost at most one
    # more group than one text does, never a read per text; a tied head reads its embedding's key twice
    eights = per_key(reads)
    groups_one, groups_eight = min(once), min(eights)
    assert groups_eight <= groups_one + 1
    assert [n * groups_one for n in eights] == [n * groups_eight for n in once]  # every weight alike, same keys
    assert max(once) <= (4 if fixture == "smollm2" else 2)


def test_a_streamed_reference_asks_for_each_weight_before_its_module_runs(monkeypatch: pytest.MonkeyPatch,
                                                                           smollm2: Path) -> None:
    """The read-ahead (engine/runtime/read_ahead.py): the bytes of every module a streamed reference reads
    were named to the kernel before the module's own read, so a cold page cache is read while the previous
    modules compute. Counted in bytes: a module whose predecessor in registration order runs after it (a
    decoder layer's input norm, a few KiB) may be asked for late."""
    asked: set[str] = set()
    early = late = 0
    load = streamed_module.Loading.load

    def asking(prefetch: Callable[[Any, Sequence[str]], None]) -> Callable[[Any, Sequence[str]], None]:
        def ask(self: Any, keys: Sequence[str]) -> None:
            asked.update(keys)
            prefetch(self, keys)
        return ask

    def loading(self: streamed_module.Loading, keys: Sequence[str]) -> set[str]:
        nonlocal early, late
        for key in keys:
            size = math.prod(self.checkpoint.shape(key))
            early, late = (early + size, late) if key in asked else (early, late + size)
        asked.difference_update(keys)
        return load(self, keys)

    monkeypatch.setattr(streamed_module, "RESIDENT_BYTES", 0)
    for checkpoint in (ArtifactCheckpoint, SafetensorsCheckpoint):  # the artifact's weights, the source's
        monkeypatch.setattr(checkpoint, "prefetch", asking(checkpoint.prefetch))
    monkeypatch.setattr(streamed_module.Loading, "load", loading)
    report = run_gates(smollm2 / "source", smollm2 / "smollm2-BF16.gguf", {2},
                       SUITE_POLICY.model_copy(update={"long_context_tokens": 256}), texts=EIGHT[:2])
    assert report.verdict == "GO", report.blockers
    assert early > 0 and late <= early / 100, (early, late)
