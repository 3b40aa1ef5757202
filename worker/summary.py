"""The human summary of a report: short, most important first, last line exactly GO or NO-GO."""

from __future__ import annotations

from worker.report import Report

MAX_BLOCKERS_SHOWN = 20


def _storage_lines(details: dict) -> list[str]:
    lines = []
    kinds = details.get("check_kinds", {})
    if kinds:
        parts = [", ".join(f"{n} {kind}" for kind, n in sorted(by_kind.items())) + f" {gtype}"
                 for gtype, by_kind in kinds.items()]
        lines.append("    tensors: " + "; ".join(parts))
        reproducers = sorted({(row["gguf_type"], row["reproducer"]) for row in details.get("tensors", [])
                              if row.get("reproducer")})
        if reproducers:
            lines.append("    reproduced byte-exactly with: "
                         + ", ".join(f"{gtype} via {tool}" for gtype, tool in reproducers))
        ties = sum(row.get("ties_forgiven", 0) for row in details.get("tensors", []))
        if ties:
            lines.append(f"    rounding ties forgiven: {ties} blocks")
    metadata = details.get("metadata", [])
    if metadata:
        agree = sum(1 for check in metadata if check["result"] == "ok")
        lines.append(f"    metadata: {agree}/{len(metadata)} keys agree with config.json and the tensors")
    return lines


def render_summary(report: Report) -> str:
    lines = []
    if report.artifact:
        lines.append(f"artifact  {report.artifact.uri}")
        lines.append(f"          sha256 {report.artifact.sha256}  {report.artifact.size:,} bytes")
    lines.append(f"policy    {report.policy['values']['version']}  sha256 {report.policy['sha256'][:16]}…")
    for name, gate in report.gates.items():
        lines.append(f"gate {name:<8} {gate.status:<8} {gate.seconds:7.2f}s")
        if name == "storage":
            lines.extend(_storage_lines(gate.details))
    if report.blockers:
        lines.append(f"blockers ({len(report.blockers)}):")
        for blocker in report.blockers[:MAX_BLOCKERS_SHOWN]:
            where = f" {blocker.tensor}" if blocker.tensor else ""
            lines.append(f"  - {blocker.code} [{blocker.gate}]{where}: {blocker.why}")
        if len(report.blockers) > MAX_BLOCKERS_SHOWN:
            lines.append(f"  … {len(report.blockers) - MAX_BLOCKERS_SHOWN} more in the JSON report")
    lines.append("not verified:")
    lines.extend(f"  - {item}" for item in report.not_verified)
    lines.append(report.verdict)
    return "\n".join(lines)
