"""The human summary of a report: short, most important first, last line exactly GO or NO-GO."""

from __future__ import annotations

from engine.blockers import safe_text
from engine.evidence import (
    LogitsSummary,
    QualityFigures,
    RuntimeDetails,
    StorageDetails,
    release_details,
    runtime_details,
    storage_details,
)
from engine.formats.artifact_files import other_shards_in, uri_name
from engine.report import FileDigest, Report

MAX_BLOCKERS_SHOWN = 20


def _storage_lines(details: StorageDetails) -> list[str]:
    lines = []
    if details.check_kinds:
        parts = [", ".join(f"{n} {kind}" for kind, n in sorted(by_kind.items())) + f" {gtype}"
                 for gtype, by_kind in details.check_kinds.items()]
        lines.append("    tensors: " + "; ".join(parts))
        reproducers = sorted({(row.gguf_type, row.reproducer) for row in details.tensors if row.reproducer})
        if reproducers:
            lines.append("    reproduced byte-exactly with: "
                         + ", ".join(f"{gtype} via {tool}" for gtype, tool in reproducers))
        ties = sum(row.ties_forgiven for row in details.tensors)
        if ties:
            lines.append(f"    rounding ties forgiven: {ties} blocks")
    if imatrix := details.imatrix:
        lines.append(f"    importance matrix ({imatrix.format}, sha256 {imatrix.sha256[:16]}…): "
                     f"{imatrix.tensors_weighted} tensors re-quantized with its weights")
    if metadata := details.metadata:
        agree = sum(1 for check in metadata if check.result == "ok")
        lines.append(f"    metadata: {agree}/{len(metadata)} keys agree with config.json and the tensors")
    return lines


def logits_line(logits: LogitsSummary) -> str:
    """Top-1 agreement counts only decisive positions; with none, the line says so instead of a figure."""
    top1 = (f"top-1 agreement {logits.top1_agreement:.1%} over {logits.decisive_positions} decisive of "
            if logits.top1_agreement is not None else "0 decisive top-1 positions (all near-ties) of ")
    return (f"logits: NMSE {logits.nmse:.3g}, KL mean {logits.kl_mean:.3g} / p99 {logits.kl_p99:.3g} / max "
            f"{logits.kl_max:.3g}, {top1}{logits.positions} positions")


def _runtime_lines(details: RuntimeDetails) -> list[str]:
    lines = []
    if tokenizer := details.tokenizer:
        best = max(tokenizer.per_combination.values(), default=0)
        lines.append(f"    tokenizer: ids equal on {best}/{len(details.texts)} texts in the best flag combination; "
                     f"normaliser {', '.join(tokenizer.normalizer) or 'none'}")
        if tokenizer.diagnosis:
            lines.append(f"    diagnosis: {tokenizer.diagnosis}")
    if (embeddings := details.embeddings) and embeddings.min_cosine is not None and embeddings.retrieval:
        normalised = ", normalised" if embeddings.normalize else ""
        lines.append(f"    embeddings ({embeddings.pooling} pooling{normalised}): min cosine "
                     f"{embeddings.min_cosine:.6f}; retrieval top-1 agreement {embeddings.retrieval.agreement:.0%}")
        if embeddings.diagnosis:
            lines.append(f"    diagnosis: {embeddings.diagnosis}")
    if details.logits and (logits := details.logits.measured()):
        lines.append("    " + logits_line(logits))
    if details.compute_classes:
        lines.append(f"    correctness against transformers on the artifact's own weights, compute "
                     f"{'/'.join(details.compute_classes)}")
    lines.extend(quality_lines(details.quality))
    return lines


def quality_lines(quality: QualityFigures | None) -> list[str]:
    """The quantization cost against the source, overall and per slice, as llama-perplexity names it."""
    if not quality:
        return []
    lines = [f"    quality against the source ({quality.precision_class} budget):"]
    for name, figures in quality.slices.items():
        parts = []
        if figures.kl_mean is not None:
            p99 = figures.kl_percentiles.get("p99", float("nan"))
            same_top = figures.same_top if figures.same_top is not None else float("nan")
            parts.append(f"KL mean {figures.kl_mean:.3g} / p99 {p99:.3g}, same top {same_top:.1%}")
        if figures.delta_p_rms is not None:
            ratio = figures.ppl_ratio if figures.ppl_ratio is not None else float("nan")
            parts.append(f"Δp RMS {figures.delta_p_rms:.3g}, PPL ratio {ratio:.4f}")
        if figures.min_cosine is not None:
            parts.append(f"min cosine {figures.min_cosine:.4f} over {figures.texts} texts")
        if parts:
            lines.append(f"      {name}: " + "; ".join(parts))
    return lines


def _where(blocker) -> str:
    if blocker.tensor:
        return f" {blocker.tensor}"
    if blocker.text:
        short = blocker.text if len(blocker.text) <= 40 else blocker.text[:37] + "..."
        return f" text {short!r}"
    return ""


def _controls_line(report: Report) -> str:
    """How many planted defects the gates caught, and what proving it cost."""
    outcomes = [control.outcome for control in report.controls]
    planted = len(outcomes) - outcomes.count("not_applicable")
    seconds, share = report.timings.get("controls", 0.0), report.timings.get("controls_share", 0.0)
    missed = f", {outcomes.count('not_detected')} NOT detected" if "not_detected" in outcomes else ""
    return (f"controls  {outcomes.count('detected')}/{planted} planted defects detected{missed} "
            f"({seconds:.2f}s, {share:.1%} of the run)")


def _other_shards(report: Report) -> list[FileDigest]:
    """A split artifact's shards after the first: the report's files right after it, named as its siblings."""
    if report.artifact is None:
        return []
    after = report.files[1:]
    return [after[position] for position in other_shards_in(report.artifact.uri, [f.uri for f in after])]


def render_summary(report: Report) -> str:
    lines = []
    if report.artifact:
        lines.append(f"artifact  {report.artifact.uri}")
        lines.append(f"          sha256 {report.artifact.sha256}  {report.artifact.size:,} bytes")
        for shard in _other_shards(report):
            lines.append(f"          {uri_name(shard.uri)}  sha256 {shard.sha256}  "
                         f"{shard.size:,} bytes")
    lines.append(f"policy    {report.policy['values']['version']}  sha256 {report.policy['sha256'][:16]}…")
    for name, gate in report.gates.items():
        lines.append(f"gate {name:<8} {gate.status:<8} {gate.seconds:7.2f}s")
        if name == "storage":
            lines.extend(_storage_lines(storage_details(gate.details)))
        elif name == "runtime":
            lines.extend(_runtime_lines(runtime_details(gate.details)))
        elif name == "release" and (package := release_details(gate.details).package):
            lines.append(f"    release package: {len(package)} file(s) digested")
    if report.controls:
        lines.append(_controls_line(report))
    if report.blockers:
        lines.append(f"blockers ({len(report.blockers)}):")
        for blocker in report.blockers[:MAX_BLOCKERS_SHOWN]:
            where = _where(blocker)
            lines.append(f"  - {blocker.code} [{blocker.gate}]{where}: {blocker.why}")
        if len(report.blockers) > MAX_BLOCKERS_SHOWN:
            lines.append(f"  … {len(report.blockers) - MAX_BLOCKERS_SHOWN} more in the JSON report")
    lines.append("not verified:")
    lines.extend(f"  - {item}" for item in report.not_verified)
    lines.append(report.verdict)
    return safe_text("\n".join(lines))
