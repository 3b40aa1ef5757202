"""The verification engine: a request and a policy in, a `Report` out. No HTTP server, no SQL, no printing.

The engine is a pure function of local files: fetching by URI happens at the edge (`edge/`), which
hands over paths and the (redacted) URI the report names the artifact by. Order matters: check the
digest, validate structure with our own parser and open the source strictly, and only then let gates
(and so gguf-py, llama.cpp, transformers) near the files. A requested gate that cannot run is a
blocker, so GO never claims more than was run.

The source's digests are the one thing taken beside a gate: they decide nothing the gates may read, so
they are computed on a thread while the first gate reads the same files (`TreeDigest`), and recorded,
with the signatures checked against them, before any gate's outcome is.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.acceptance import accept_unreproduced
from engine.blockers import Blocker
from engine.controls.run import ControlInputs, run_controls, undetected
from engine.digests import TreeDigest, digest_file, sha256_file
from engine.errors import ConvgateError
from engine.formats.artifact_files import artifact_paths, sibling_uri
from engine.formats.gguf_structure import GGUFLayout
from engine.formats.source import SourceModel
from engine.gates import registry
from engine.gates.contract import GateContext, GateOutcome
from engine.gates.storage.gate import open_source_or_blocker, storage_notes, validate_structure
from engine.gates.storage.parts import StoragePart, merge_parts
from engine.policy import Policy
from engine.progress import Progress, no_progress
from engine.quant.imatrix import ImatrixError, ImportanceMatrix, read_imatrix
from engine.report import Control, FileDigest, GateResult, Report, SignatureCheck
from engine.request import LocalInputs, VerifyRequest
from engine.resources import cpu_budget
from engine.signature_check import check_signatures
from engine.versions import package_version
from engine.warm_imports import import_on_a_thread

ALWAYS_NOT_VERIFIED = (
    "retrieval quality against ground truth (only agreement with the reference model is measured)",
    "behaviour on inputs outside the verified text set",
    "quantized tensors the verifier cannot reproduce (no importance matrix given, or another quantizer) are "
    "NO-GO (tensor.not_reproduced / tensor.other_quantizer) unless the policy lets a passing gate 2 vouch for them",
)
IMATRIX_TAKEN_AS_GIVEN = ("the importance matrix is taken as given: whether it was computed from this source model "
                          "over the texts it names is not verified")
ENVIRONMENT_PACKAGES = ("convgate", "gguf", "numpy", "llama-cpp-python", "transformers", "torch", "tokenizers")


class SourceUnavailableError(ConvgateError):
    """The source model cannot be read at all: no verdict is possible (CLI exit 2)."""

    code = "engine.source_unavailable"


def environment() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for package in ENVIRONMENT_PACKAGES:
        versions[package] = package_version(package) or "not installed"
    versions["threads"] = str(cpu_budget())  # every thread pool's size: the pod's CPU limit or CONVGATE_THREADS
    return versions


class _Run:
    """Accumulates one verification's gates, blockers, files and timings."""

    def __init__(self, request: VerifyRequest) -> None:
        self.request = request
        self.started = time.perf_counter()
        self.blockers: list[Blocker] = []
        self.gates: dict[str, GateResult] = {}
        self.files: list[FileDigest] = []
        self.timings: dict[str, float] = {}
        self.not_verified = [f"gate {gate.number} ({gate.name}) was not requested" for gate in registry.GATES
                             if gate.number not in request.gates]
        self.artifact: FileDigest | None = None
        self.imatrix: FileDigest | None = None
        self.controls: list[Control] = []
        self.signatures: list[SignatureCheck] = []

    def stop_all(self, blocker: Blocker | tuple[Blocker, ...], why: str) -> None:
        self.blockers.extend(blocker if isinstance(blocker, tuple) else (blocker,))
        for gate in registry.requested(self.request.gates):
            self.gates[gate.name] = GateResult(name=gate.name, status="not_run", details={"why": why})

    def record(self, outcome: GateOutcome, pieces: int) -> None:
        """One gate's outcome into the report: its result (a part of gate 1 waits for the merge), blockers,
        notes, and the release package's files after the artifact's `pieces`."""
        if outcome.result is not None:
            self.gates[outcome.result.name] = outcome.result
            self.timings[outcome.result.name] = outcome.result.seconds
        self.blockers.extend(outcome.blockers)
        self.not_verified.extend(outcome.not_verified)
        self.files[pieces:pieces] = outcome.package_files

    def check_signatures(self, inputs: LocalInputs, policy: Policy, pieces: int) -> None:
        """The publishers' signatures against the files digested so far (the artifact's `pieces`, then the
        source's); a bad one is NO-GO whatever the gates find, and they still run, to say what else."""
        signed = check_signatures(inputs.signatures(self.request), self.request.trusted_signers, policy,
                                  pieces=self.files[:pieces], source_files=self.files[pieces:],
                                  source_uri=inputs.source_name)
        self.files.extend(signed.files)
        self.signatures = signed.checks
        self.blockers.extend(signed.blockers)

    def check_controls(self, inputs: ControlInputs) -> None:
        """Plant one defect per comparison of every gate that ran; one that passes is a blocker."""
        self.controls = run_controls(inputs)
        self.blockers.extend(undetected(self.controls))
        self.timings["controls"] = sum(control.seconds for control in self.controls)

    def report(self, policy: Policy) -> Report:
        self.timings["total"] = time.perf_counter() - self.started
        if "controls" in self.timings:  # what proving the gates could fail cost, as a share of the run
            self.timings["controls_share"] = self.timings["controls"] / self.timings["total"]
        self.blockers, accepted = accept_unreproduced(self.blockers, self.gates, policy)
        self.not_verified.extend(accepted)
        return Report(
            verdict="NO-GO" if self.blockers or not self.gates else "GO",
            blockers=self.blockers, gates=self.gates,
            policy={"values": policy.model_dump(mode="json"), "sha256": policy.sha256()},
            artifact=self.artifact, files=self.files, not_verified=self.not_verified + list(ALWAYS_NOT_VERIFIED),
            environment=environment(), timings=self.timings, controls=self.controls, signatures=self.signatures,
        )


def unfetched(request: VerifyRequest, policy: Policy, blocker: Blocker) -> Report:
    """The NO-GO for an artifact the edge could not fetch for a definitive reason (404, refused, digest)."""
    run = _Run(request)
    run.stop_all(blocker, "artifact not fetched")
    return run.report(policy)


@dataclass(frozen=True)
class _Refusal:
    """What stops a verification before any gate, and why (every gate is then "not run")."""

    blockers: tuple[Blocker, ...]
    why: str


@dataclass(frozen=True)
class _Prepared:
    """What the gates need besides the digests, read before them: the importance matrix (its digest too, so
    a refused one is named), and the structure and source our own parsers accepted, or what refused them."""

    imatrix_file: FileDigest | None
    imatrix: ImportanceMatrix | None
    opened: tuple[GGUFLayout, SourceModel] | _Refusal


def _prepare(request: VerifyRequest, inputs: LocalInputs) -> _Prepared:
    """The importance matrix's expected digest checked before our bounded reader reads it; then the artifact's
    structure and the source, each by our own strict parser, before gguf-py, llama.cpp or transformers."""
    imatrix_file, imatrix = _read_imatrix(request, inputs)
    if isinstance(imatrix, Blocker):
        return _Prepared(imatrix_file, None, _Refusal((imatrix,), "the importance matrix was refused"))
    layout = validate_structure(inputs.artifact)
    if isinstance(layout, tuple):
        return _Prepared(imatrix_file, imatrix, _Refusal(layout, "the artifact is not a well-formed GGUF"))
    source = open_source_or_blocker(inputs.source)
    if isinstance(source, Blocker):
        return _Prepared(imatrix_file, imatrix, _Refusal((source,), "the source model was refused"))
    return _Prepared(imatrix_file, imatrix, (layout, source))


def _read_imatrix(request: VerifyRequest, inputs: LocalInputs) -> tuple[FileDigest | None,
                                                                        ImportanceMatrix | Blocker | None]:
    if inputs.imatrix is None:
        return None, None
    if not inputs.imatrix.is_file():
        return None, Blocker(code="imatrix.unavailable", gate="input", why=f"{inputs.imatrix} is not a readable file")
    digest = digest_file(inputs.imatrix, inputs.imatrix_uri)
    expected = request.imatrix_sha256
    if expected is not None and expected.lower() != digest.sha256:
        return digest, Blocker(code="imatrix.sha256_mismatch", gate="input",
                               why=f"importance matrix sha256 is {digest.sha256}, expected {expected}; not used")
    try:
        return digest, read_imatrix(inputs.imatrix)
    except ImatrixError as exc:
        return digest, Blocker(code=exc.code, gate="input", why=exc.why)


def _record_imatrix(run: _Run, prepared: _Prepared) -> None:
    if prepared.imatrix_file is not None:
        run.imatrix = prepared.imatrix_file
        run.files.append(prepared.imatrix_file)
    if prepared.imatrix is not None:
        run.not_verified.append(IMATRIX_TAKEN_AS_GIVEN)


def _shifted(progress: Progress, before: int, total: int) -> Callable[[int, int], None]:
    """One file's hashing progress as progress through all of the artifact's files."""
    return lambda done, _size: progress("sha256", before + done, total)


def _digest_shards(artifact: Path, artifact_uri: str, progress: Progress) -> dict[int, FileDigest]:
    """The digest of every file of the artifact by its place: one, or each shard of a split that exists (a
    missing one is named by gate 1's split check), each named by the artifact's URI with its file name."""
    paths = artifact_paths(artifact)
    present = {position: path for position, path in enumerate(paths) if path == artifact or path.is_file()}
    total = sum(path.stat().st_size for path in present.values())
    digests: dict[int, FileDigest] = {}
    before = 0
    for position, path in present.items():
        uri = artifact_uri if path == artifact else sibling_uri(artifact_uri, path.name)
        sha = sha256_file(path, _shifted(progress, before, total))
        digests[position] = FileDigest(uri=uri, sha256=sha, size=path.stat().st_size)
        before += digests[position].size
    return digests


def _digest_mismatches(request: VerifyRequest, files: int, shards: dict[int, FileDigest]) -> tuple[Blocker, ...]:
    """Every pinned digest a file does not have, each named. A split pinned by another number of digests than
    its name has shards is refused whole: which digest pins which file would be a guess."""
    pinned = request.shard_sha256 or ((request.expected_sha256,) if request.expected_sha256 else ())
    if request.shard_sha256 and request.expected_sha256 and request.expected_sha256.lower() != pinned[0].lower():
        return (Blocker(code="artifact.sha256_mismatch", gate="input",
                        why="the artifact's sha256 and its first shard's pinned sha256 differ; nothing is used"),)
    if request.shard_sha256 and len(pinned) != files:
        return (Blocker(code="artifact.sha256_mismatch", gate="input",
                        why=f"{len(pinned)} shard digests were pinned for a {files}-file artifact; not used"),)
    found = []
    for position, digest in shards.items():
        if position < len(pinned) and pinned[position].lower() != digest.sha256:
            what = f"shard {position + 1}" if files > 1 else "artifact"
            found.append(Blocker(code="artifact.sha256_mismatch", gate="input",
                                 why=f"{what} sha256 is {digest.sha256}, expected {pinned[position]}; not used"))
    return tuple(found)


def verify_shard(request: VerifyRequest, inputs: LocalInputs, policy: Policy, progress: Progress, shard: int,
                 shards: int) -> tuple[Report, StoragePart | None]:
    """One shard of a verification split over pods: (the report without gate 1's values, this shard's part
    of gate 1). Gates 2 and 3 run whole, in shard 0; a stop before any gate gives the full report and no
    part. `merge_shards(shard 0's report, every part)` gives the verification's report."""
    run = _Run(request)
    source_dir, artifact = inputs.source, inputs.artifact
    if not source_dir.is_dir():
        raise SourceUnavailableError(f"{inputs.source_name} is not a directory")
    if not artifact.is_file():
        return unfetched(request, policy, Blocker(code="artifact.unreadable", gate="input",
                                                  why=f"{inputs.artifact_name} is not a readable file")), None
    tree = TreeDigest(source_dir, inputs.source_name)
    try:
        return _verify_digested(run, inputs, policy, progress, tree, (shard, shards))
    finally:
        tree.stop()


def _verify_digested(run: _Run, inputs: LocalInputs, policy: Policy, progress: Progress, tree: TreeDigest,
                     placement: tuple[int, int]) -> tuple[Report, StoragePart | None]:
    """verify_shard once the source's digest has started: the artifact's digest checked first, the first
    gate run while the source is digested, and everything recorded in the order a sequential run records
    it (digests, signatures, the importance matrix, structure, source, gates)."""
    request, artifact, (shard, shards) = run.request, inputs.artifact, placement
    digests = _digest_shards(artifact, inputs.artifact_name, progress)
    pieces = list(digests.values())  # the artifact's files: one, or every shard of a split
    run.artifact = pieces[0]
    run.timings["fetch_and_digest"] = time.perf_counter() - run.started
    if mismatched := _digest_mismatches(request, len(artifact_paths(artifact)), digests):
        run.files = [*pieces, *tree.result()]
        run.stop_all(mismatched, "artifact digest mismatch")
        return run.report(policy), None
    prepared = _prepare(request, inputs)
    gates = [gate for gate in registry.requested(request.gates) if shard == 0 or gate.every_shard]
    context: GateContext | _Refusal = prepared.opened if isinstance(prepared.opened, _Refusal) else GateContext(
        request=request, inputs=inputs, policy=policy, progress=progress, pieces=pieces, layout=prepared.opened[0],
        source=prepared.opened[1], imatrix=prepared.imatrix, imatrix_file=prepared.imatrix_file, shard=shard,
        shards=shards)
    warming = import_on_a_thread([name for gate in gates[1:] for name in gate.libraries]) if isinstance(
        context, GateContext) else None
    try:
        first = gates[0].run(context) if gates and isinstance(context, GateContext) else None
    finally:  # the later gates (or, after an error, the process's next verification) import what it imports
        if warming is not None:
            warming.join()
    waited = time.perf_counter()
    run.files = [*pieces, *tree.result()]
    run.timings["fetch_and_digest"] += time.perf_counter() - waited
    run.check_signatures(inputs, policy, len(pieces))
    _record_imatrix(run, prepared)
    if isinstance(context, _Refusal):
        run.stop_all(context.blockers, context.why)
        return run.report(policy), None
    if first is not None:  # the first gate ran beside the source's digest; the others run now, in order
        run.record(first, len(pieces))
    for gate in gates[1:]:
        run.record(gate.run(context), len(pieces))
    if shard != 0:
        return run.report(policy), context.part
    ran = {name for name, gate in run.gates.items() if gate.status != "not_run"} | (
        {"storage"} if context.part else set())
    run.check_controls(ControlInputs(artifact=artifact, artifact_sha256=run.artifact.sha256, layout=context.layout,
                                     source=context.source, policy=policy, imatrix=context.imatrix,
                                     runtime=context.measured, gates_run=frozenset(ran)))
    return run.report(policy), context.part


def merge_shards(head: Report, parts: list[StoragePart], policy: Policy) -> Report:
    """The one report of a verification whose gate 1 ran in parts: shard 0's report (every other gate)
    with gate 1 merged from all parts placed first, and the policy's acceptance decided over all blockers.
    Raises `MergeError` when the parts do not fit together."""
    storage, storage_blockers = merge_parts(parts, policy)
    gates = {"storage": storage, **head.gates}
    blockers, accepted = accept_unreproduced(storage_blockers + head.blockers, gates, policy)
    kept = [note for note in head.not_verified if note not in ALWAYS_NOT_VERIFIED]
    return head.model_copy(update={
        "verdict": "NO-GO" if blockers else "GO", "blockers": blockers, "gates": gates,
        "not_verified": kept + storage_notes(storage) + accepted + list(ALWAYS_NOT_VERIFIED),
        "timings": {"storage": storage.seconds, **head.timings},
    })


def verify(request: VerifyRequest, inputs: LocalInputs, policy: Policy, progress: Progress = no_progress) -> Report:
    """Run the requested gates on local files. GO needs zero blockers and every requested gate to have run.
    Gate 1 is one part merged alone: the same path, and so the same report, as a run split over pods."""
    head, part = verify_shard(request, inputs, policy, progress, 0, 1)
    return head if part is None else merge_shards(head, [part], policy)


__all__ = ["LocalInputs", "SourceUnavailableError", "VerifyRequest", "environment", "merge_shards", "unfetched",
           "verify", "verify_shard"]
