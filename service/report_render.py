"""A stored report as Markdown or HTML, ending with a model-card section a release can paste:
digests of every file, thresholds, results and what was not verified."""

from __future__ import annotations

import html
from typing import Any

POLICY_KEYS = ("token_ids_exact", "require_top1_equal", "reproduce_quantized", "reproduce_sample", "tie_ulps")


def _gate_lines(report: dict[str, Any]) -> list[str]:
    lines = ["| gate | status | seconds |", "|---|---|---|"]
    for name, gate in report["gates"].items():
        lines.append(f"| {name} | {gate['status']} | {gate['seconds']:.2f} |")
    return lines


def _results(report: dict[str, Any]) -> list[str]:
    lines = []
    storage = report["gates"].get("storage", {}).get("details", {})
    for gguf_type, kinds in storage.get("check_kinds", {}).items():
        lines.append(f"- {gguf_type}: " + ", ".join(f"{n} {kind}" for kind, n in kinds.items()))
    embeddings = report["gates"].get("runtime", {}).get("details", {}).get("embeddings")
    if embeddings:
        lines.append(f"- embeddings: min cosine {embeddings['min_cosine']:.6f}, retrieval top-1 agreement "
                     f"{embeddings['retrieval']['agreement']:.0%}")
    logits = (report["gates"].get("runtime", {}).get("details", {}).get("logits") or {}).get("summary")
    if logits:
        lines.append(f"- logits: NMSE {logits['nmse']:.3g}, KL mean {logits['kl_mean']:.3g}, "
                     f"top-1 agreement {logits['top1_agreement']:.1%}")
    quality = report["gates"].get("runtime", {}).get("details", {}).get("quality")
    overall = (quality or {}).get("slices", {}).get("overall") or {}
    if "kl_mean" in overall:
        lines.append(f"- quantization cost against the source: KL mean {overall['kl_mean']:.3g}, same top token "
                     f"{overall['same_top']:.1%}, perplexity ratio {overall.get('ppl_ratio', float('nan')):.4f}")
    if "min_cosine" in overall:
        lines.append(f"- quantization cost against the source: min cosine {overall['min_cosine']:.4f}")
    return lines


def policy_origin_line(origin: str | None) -> str:
    """Where the thresholds came from: a GO under anything but a configured policy says so first."""
    if origin is not None and origin.startswith("configured:"):
        return f"Thresholds: the configured policy `{origin.removeprefix('configured:')}`."
    if origin == "inline":
        return ("**Warning: inline policy** - the thresholds were sent with the request, not a policy "
                "configured by the operator; this verdict was not held to the platform's thresholds.")
    return ("**Warning: policy origin not recorded** - this verdict predates recording it; it may not be a "
            "policy configured by the operator.")


def model_card(report: dict[str, Any], origin: str | None = None) -> list[str]:
    values = report["policy"]["values"]
    lines = ["## Verification (model card section)", "",
             f"Verdict: **{report['verdict']}** under convgate policy {values.get('version')} "
             f"(sha256 `{report['policy']['sha256']}`).", "", policy_origin_line(origin), "", "Files:", "",
             "| file | sha256 | bytes |", "|---|---|---|"]
    lines += [f"| {f['uri']} | `{f['sha256']}` | {f['size']} |" for f in report["files"]]
    runtime = report["gates"].get("runtime", {}).get("details", {})
    applied = runtime.get("thresholds") or {}
    precision = f" (gate 2 correctness for compute {'/'.join(runtime.get('compute_classes', []))}: " + ", ".join(
        f"{k}={v:g}" for k, v in applied.items()) + ")" if applied else ""
    lines += ["", "Thresholds: " + ", ".join(f"{k}={values[k]}" for k in POLICY_KEYS if k in values) + precision, "",
              "Results:", "", *(_results(report) or ["- (no gate results)"]), "", "Not verified:", ""]
    lines += [f"- {item}" for item in report["not_verified"]]
    return lines


def to_markdown(verification_id: str, report: dict[str, Any], origin: str | None = None) -> str:
    """`origin` is the verification's policy origin (`configured:<name>`, `inline`, or None: unknown)."""
    lines = [f"# convgate verification {verification_id}", "", f"**{report['verdict']}**", "",
             policy_origin_line(origin), "",
             f"Artifact: `{report['artifact']['uri']}` sha256 `{report['artifact']['sha256']}`"
             if report.get("artifact") else "Artifact: (not fetched)", "", *_gate_lines(report), ""]
    if report["blockers"]:
        lines += ["## Blockers", ""]
        lines += [f"- `{b['code']}` ({b['gate']}) {b.get('tensor') or ''} {b['why']}" for b in report["blockers"]]
        lines.append("")
    return "\n".join(lines + model_card(report, origin)) + "\n"


STYLE = ("body{font:15px/1.45 system-ui,sans-serif;margin:2rem auto;max-width:70rem;color:#1d2330}"
         "table{border-collapse:collapse}td,th{border-bottom:1px solid #dde2ea;padding:.3rem .7rem;text-align:left}"
         "code{font-size:.9em}")


def to_html(verification_id: str, report: dict[str, Any], origin: str | None = None) -> str:
    """The Markdown rendered by markdown-it (raw HTML disabled, so report text cannot inject markup)."""
    from markdown_it import MarkdownIt

    markdown = to_markdown(verification_id, report, origin)
    body = MarkdownIt("commonmark", {"html": False}).enable("table").render(markdown)
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>convgate "
            f"{html.escape(verification_id)}</title><style>{STYLE}</style></head><body>{body}</body></html>")
