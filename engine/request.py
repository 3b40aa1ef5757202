"""What a verification is asked: the request (what to check and how) and the local inputs (where the bytes are).

Their own module, apart from the engine, because every gate reads them through its context
(`engine/gates/contract.py`), and the gates must not import the engine that loops over them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from engine.gates.runtime.labelled_retrieval import LabelledSet
from engine.signature_check import SignatureInput


@dataclass(frozen=True, kw_only=True)
class VerifyRequest:
    """What to check and how."""

    expected_sha256: str | None = None
    gates: frozenset[int] = frozenset({1, 2, 3})
    texts: tuple[str, ...] | None = None  # the submitter's texts without a set name (slice `submitted`)
    text_sets: Mapping[str, tuple[str, ...]] | None = None  # named sets: one slice each (a language, a domain)
    kind: str = "auto"
    imatrix_sha256: str | None = None
    # a gguf-split artifact: every shard's expected sha256 in order, the first shard's included; when given,
    # each must match (expected_sha256, if also given, is the first's)
    shard_sha256: tuple[str, ...] = ()
    # publishers' OMS signatures: their pinned digests, and the public keys (PEM) trusted to have made them,
    # which come from the operator's configuration, never from the submitter
    source_signature_sha256: str | None = None
    artifact_signature_sha256: str | None = None
    trusted_signers: tuple[str, ...] = ()
    # the submitter's own labelled retrieval set for an embedding model (gate 2's built-in one otherwise)
    labelled_set: LabelledSet | None = None


@dataclass(frozen=True, kw_only=True)
class LocalInputs:
    """Where the bytes are: local paths, and the URI the report names the artifact by."""

    source: Path
    source_uri: str | None = None  # default: the source directory's file:// URI
    artifact: Path
    artifact_uri: str | None = None  # default: the artifact's file:// URI
    release_files: tuple[Path, ...] = ()
    imatrix: Path | None = None  # the importance matrix the artifact was quantized with, if any
    imatrix_uri: str | None = None  # default: the imatrix's file:// URI
    source_signature: Path | None = None  # the source publisher's OMS signature, if any
    source_signature_uri: str | None = None
    artifact_signature: Path | None = None  # the artifact publisher's OMS signature, if any
    artifact_signature_uri: str | None = None

    def signatures(self, request: VerifyRequest) -> list[SignatureInput]:
        """The publishers' signatures given, each named by its URI and pinned by its expected digest."""
        found = []
        if self.source_signature is not None:
            found.append(SignatureInput(of="source", path=self.source_signature,
                                        uri=self.source_signature_uri or self.source_signature.absolute().as_uri(),
                                        expected_sha256=request.source_signature_sha256))
        if self.artifact_signature is not None:
            found.append(SignatureInput(of="artifact", path=self.artifact_signature,
                                        uri=self.artifact_signature_uri or self.artifact_signature.absolute().as_uri(),
                                        expected_sha256=request.artifact_signature_sha256))
        return found

    @property
    def artifact_name(self) -> str:
        return self.artifact_uri or self.artifact.absolute().as_uri()

    @property
    def source_name(self) -> str:
        """What the report calls the source: the URI it was asked by, not the store path it was fetched to."""
        return self.source_uri or self.source.absolute().as_uri()
