"""Gate 1's per-tensor value checks, in this process or spread over a pool of processes.

Re-quantizing a K-quant tensor through libggml runs at ~9 M weights/s on one core, so a 7B model
would take 13 minutes on a pod that may have 8 CPUs. Each pool process reopens the artifact's memory
map, the source and the inventory itself (nothing large crosses a pipe: a tensor's row and blockers
come back), tensors are handed out largest first so the pool finishes together, and results are put
back in inventory order: the report is the same whatever the number of processes.
"""

from __future__ import annotations

import math
import multiprocessing
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from pydantic import BaseModel

from engine.blockers import Blocker
from engine.errors import ReferenceMissingError, UnsupportedTypeError
from engine.formats.artifact_files import ArtifactBytes, artifact_bytes, artifact_layout
from engine.formats.gguf_structure import GGUFLayout
from engine.formats.source import open_source
from engine.gates.architectures import architecture_for
from engine.gates.computed_tensors import ComputedTensor, check_computed
from engine.gates.inventory import Pairing, take_inventory
from engine.gates.storage.tensor_values import check_tensor
from engine.policy import Policy
from engine.progress import Progress
from engine.quant.imatrix import ImatrixError, ImportanceMatrix
from engine.report import TensorRow

# Below this many weights a pool costs more (a fresh interpreter per process, ~1 s) than it saves.
PARALLEL_MIN_WEIGHTS = 32_000_000


class CheckedPair(BaseModel):
    """One inventory pair's outcome: its row (None when it could not be compared), blockers, and whether
    an importance matrix weighed it. Plain data: it crosses process pipes and, in a shard's part, the
    database."""

    index: int
    row: TensorRow | None
    blockers: list[Blocker]
    weighted: bool


@dataclass(frozen=True)
class ValueJob:
    """What a pool process needs to rebuild the same pairs the parent has (all picklable)."""

    artifact: Path
    source_root: Path
    policy: Policy
    imatrix: ImportanceMatrix | None
    pair_names: tuple[str, ...]
    sample_seed: str | None


def check_one(file_bytes: ArtifactBytes, layout: GGUFLayout, pair: Pairing, index: int, policy: Policy,
              imatrix: ImportanceMatrix | None, sample_seed: str | None = None) -> CheckedPair:
    """Inventory pair `index`; errors that concern only this tensor become its blockers."""
    info = layout.tensor(pair.gguf_name)
    blocked = partial(CheckedPair, index=index, row=None, weighted=False)
    if isinstance(pair.source, ComputedTensor):  # no source bytes: values computed from the config
        row, blockers = check_computed(file_bytes, info, pair.source)
        return CheckedPair(index=index, row=row, blockers=blockers, weighted=False)
    try:
        weights = imatrix.weights_for(info.name, info.shape) if imatrix and info.ggml_type.quantized else None
        row, blockers = check_tensor(file_bytes, info, pair.source, pair.transform, policy, quant_weights=weights,
                                     sample_seed=sample_seed)
    except ImatrixError as exc:
        return blocked(blockers=[Blocker(code=exc.code, gate="storage", why=exc.why, tensor=info.name)])
    except ReferenceMissingError as exc:
        return blocked(blockers=[Blocker(code="verifier.reference_missing", gate="verifier", why=str(exc),
                                         tensor=info.name)])
    except UnsupportedTypeError as exc:
        return blocked(blockers=[Blocker(code="tensor.type_unsupported", gate="storage", why=str(exc),
                                         tensor=info.name)])
    return CheckedPair(index=index, row=row, blockers=blockers, weighted=weights is not None)


class _Worker:
    """A pool process's own view of the job, built once by `_start`."""

    file_bytes: ArtifactBytes
    layout: GGUFLayout
    pairs: tuple[Pairing, ...]
    job: ValueJob


_worker = _Worker()


def _start(job: ValueJob) -> None:
    from engine.resources import limit_native_threads

    limit_native_threads(1)  # one process per CPU already; a BLAS pool inside each would oversubscribe
    layout = artifact_layout(job.artifact)
    source = open_source(job.source_root)
    arch = architecture_for(str(layout.metadata.get("general.architecture", "")), source.config)
    if arch is None:
        raise RuntimeError("the pool process found no architecture map the parent had")
    pairs = take_inventory(arch, layout, source).pairs
    if tuple(pair.gguf_name for pair in pairs) != job.pair_names:
        raise RuntimeError("the pool process paired the tensors differently from the parent")
    _worker.file_bytes = artifact_bytes(job.artifact)
    _worker.layout, _worker.pairs, _worker.job = layout, pairs, job


def _check_index(index: int) -> CheckedPair:
    job = _worker.job
    return check_one(_worker.file_bytes, _worker.layout, _worker.pairs[index], index, job.policy, job.imatrix,
                     job.sample_seed)


def _weights(layout: GGUFLayout, pair: Pairing) -> int:
    return math.prod(layout.tensor(pair.gguf_name).shape)


def pool_size(layout: GGUFLayout, pairs: tuple[Pairing, ...], cpus: int) -> int:
    """Processes worth starting: one per CPU, none for a model too small to repay their start."""
    if cpus <= 1 or len(pairs) <= 1 or sum(_weights(layout, pair) for pair in pairs) < PARALLEL_MIN_WEIGHTS:
        return 1
    return min(cpus, len(pairs))


def _in_pool(job: ValueJob, layout: GGUFLayout, pairs: tuple[Pairing, ...], chosen: list[int],
             processes: int) -> Iterator[CheckedPair]:
    """The outcome of every chosen pair, largest tensors first, from `processes` spawned interpreters."""
    largest_first = sorted(chosen, key=lambda i: (-_weights(layout, pairs[i]), i))
    context = multiprocessing.get_context("spawn")  # no fork: the parent may hold torch or llama.cpp threads
    with ProcessPoolExecutor(processes, mp_context=context, initializer=_start, initargs=(job,)) as pool:
        yield from pool.map(_check_index, largest_first)


def _here(job: ValueJob, layout: GGUFLayout, pairs: tuple[Pairing, ...],
          chosen: list[int]) -> Iterator[CheckedPair]:
    file_bytes = artifact_bytes(job.artifact)
    for index in chosen:
        yield check_one(file_bytes, layout, pairs[index], index, job.policy, job.imatrix, job.sample_seed)


def check_values(artifact: Path, layout: GGUFLayout, source_root: Path, pairs: tuple[Pairing, ...], policy: Policy,
                 progress: Progress, imatrix: ImportanceMatrix | None, *, processes: int = 1,
                 sample_seed: str | None = None, only: list[int] | None = None) -> list[CheckedPair]:
    """The outcome of every pair (or of the pairs `only` names), in inventory order whatever order the
    processes finished in."""
    chosen = list(range(len(pairs))) if only is None else sorted(only)
    job = ValueJob(artifact, source_root, policy, imatrix, tuple(pair.gguf_name for pair in pairs), sample_seed)
    processes = min(processes, len(chosen))
    outcomes = _in_pool(job, layout, pairs, chosen, processes) if processes > 1 else _here(job, layout, pairs, chosen)
    found: dict[int, CheckedPair] = {}
    progress("storage", 0, len(chosen))
    for checked in outcomes:
        found[checked.index] = checked
        progress("storage", len(found), len(chosen))
    return [found[index] for index in chosen]
