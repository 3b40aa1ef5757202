"""A stored report as Markdown or HTML, ending with a model-card section a release can paste:
digests of every file, thresholds, results and what was not verified.

Reports render only what we wrote: every string that came from the request or the stored report (a
submitter's URIs, a policy author's version, a worker's messages and names) enters the Markdown through
`md_text` or `md_code`, so it shows as the text it is, never as a link, an image, a heading, a table row
or a line of its own; markdown-it then escapes it once more for HTML.
"""

from __future__ import annotations

import re
from typing import Any

from engine.evidence import gate_details, runtime_details, storage_details

POLICY_KEYS = ("token_ids_exact", "require_top1_equal", "reproduce_quantized", "reproduce_sample", "tie_ulps")
# The characters that open inline Markdown wherever they stand (emphasis, code spans, links and images, raw
# HTML and autolinks, entities, table cells, a heading's closing #s, the escape itself), backslash-escaped so
# CommonMark shows them as themselves; a control character (a line break above all) becomes its visible
# Unicode control picture (\n -> U+240A), so the text cannot leave the line it was put on to start a heading,
# a list item, a table row or a "Verdict" line of its own. Other punctuation (a URI's : / . -) is left as
# written: it opens nothing mid-line, and a reader of the file or a diff sees the text, not backslashes.
INERT = str.maketrans({**{mark: "\\" + mark for mark in "\\`*_[]<>&|!~#"},
                       **{chr(code): chr(0x2400 + code) for code in range(0x20)}, "\x7f": "\u2421"})
# What opens a block at the start of a list item's content: a quote, a bullet or ordered list item (its
# marker followed by a space or nothing), a thematic break (---); a heading's # is escaped everywhere
BLOCK_OPENER = re.compile(r"^(>|[-+](?=[ ]|$)|-(?=-)|\d{1,9}[.)](?=[ ]|$))")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def md_text(value: object) -> str:
    """Text someone else wrote, as Markdown inline text (a paragraph, a list item or a table cell) that
    renders as exactly that text, line breaks shown as symbols. A leading space becomes a character
    reference, since a list item opening with spaces would otherwise turn into a code block; a leading block
    opener is escaped, since a list item may hold a heading or another list."""
    text = str(value).translate(INERT)
    if text.startswith(" "):
        return "&#32;" + text[1:]
    opener = BLOCK_OPENER.match(text)
    return text if opener is None else text[: opener.end() - 1] + "\\" + text[opener.end() - 1:]


def md_code(value: object) -> str:
    """A URI, digest, code or name as a code span, which shows its content raw: fenced by one backtick more
    than its longest run of them. Text a code span cannot hold goes through `md_text`: a line break (it would
    leave the line), a `|` (GFM splits a table cell on it even inside a code span), or nothing at all."""
    text = str(value)
    if not text or "|" in text or CONTROL.search(text):
        return md_text(text)
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    padded = f" {text} " if text[0] in "` " or text[-1] in "` " else text
    return f"{fence}{padded}{fence}"


def _gate_lines(report: dict[str, Any]) -> list[str]:
    lines = ["| gate | status | seconds |", "|---|---|---|"]
    for name, gate in report["gates"].items():
        lines.append(f"| {md_text(name)} | {md_text(gate['status'])} | {gate['seconds']:.2f} |")
    return lines


def _results(report: dict[str, Any]) -> list[str]:
    lines = []
    storage = storage_details(gate_details(report, "storage"))
    for gguf_type, kinds in storage.check_kinds.items():
        lines.append(f"- {md_text(gguf_type)}: " + ", ".join(f"{md_text(n)} {md_text(kind)}"
                                                             for kind, n in kinds.items()))
    runtime = runtime_details(gate_details(report, "runtime"))
    if (embeddings := runtime.embeddings) and embeddings.min_cosine is not None and embeddings.retrieval:
        lines.append(f"- embeddings: min cosine {embeddings.min_cosine:.6f}, retrieval top-1 agreement "
                     f"{embeddings.retrieval.agreement:.0%}")
    if runtime.logits and (logits := runtime.logits.measured()):
        top1 = (f"top-1 agreement {logits.top1_agreement:.1%} over {logits.decisive_positions} decisive positions"
                if logits.top1_agreement is not None else "no decisive top-1 position (all near-ties)")
        lines.append(f"- logits: NMSE {logits.nmse:.3g}, KL mean {logits.kl_mean:.3g}, {top1}")
    overall = runtime.quality.slices.get("overall") if runtime.quality else None
    if overall and overall.kl_mean is not None:
        same_top = overall.same_top if overall.same_top is not None else float("nan")
        ratio = overall.ppl_ratio if overall.ppl_ratio is not None else float("nan")
        lines.append(f"- quantization cost against the source: KL mean {overall.kl_mean:.3g}, same top token "
                     f"{same_top:.1%}, perplexity ratio {ratio:.4f}")
    if overall and overall.min_cosine is not None:
        lines.append(f"- quantization cost against the source: min cosine {overall.min_cosine:.4f}")
    return lines


def policy_origin_line(origin: str | None) -> str:
    """Where the thresholds came from: a GO under anything but a configured policy says so first."""
    if origin is not None and origin.startswith("configured:"):
        return f"Thresholds: the configured policy {md_code(origin.removeprefix('configured:'))}."
    if origin == "inline":
        return ("**Warning: inline policy** - the thresholds were sent with the request, not a policy "
                "configured by the operator; this verdict was not held to the platform's thresholds.")
    return ("**Warning: policy origin not recorded** - this verdict predates recording it; it may not be a "
            "policy configured by the operator.")


def model_card(report: dict[str, Any], origin: str | None = None) -> list[str]:
    values = report["policy"]["values"]
    lines = ["## Verification (model card section)", "",
             f"Verdict: **{md_text(report['verdict'])}** under convgate policy {md_text(values.get('version'))} "
             f"(sha256 {md_code(report['policy']['sha256'])}).", "", policy_origin_line(origin), "", "Files:", "",
             "| file | sha256 | bytes |", "|---|---|---|"]
    lines += [f"| {md_code(f['uri'])} | {md_code(f['sha256'])} | {md_text(f['size'])} |" for f in report["files"]]
    runtime = runtime_details(gate_details(report, "runtime"))
    applied = runtime.thresholds
    compute = "/".join(md_text(name) for name in runtime.compute_classes)
    precision = f" (gate 2 correctness for compute {compute}: " + ", ".join(
        f"{md_text(k)}={v:g}" for k, v in applied.items()) + ")" if applied else ""
    lines += ["", "Thresholds: " + ", ".join(f"{k}={md_text(values[k])}" for k in POLICY_KEYS if k in values)
              + precision, "",
              "Results:", "", *(_results(report) or ["- (no gate results)"]), "", "Not verified:", ""]
    lines += [f"- {md_text(item)}" for item in report["not_verified"]]
    return lines


def to_markdown(verification_id: str, report: dict[str, Any], origin: str | None = None) -> str:
    """`origin` is the verification's policy origin (`configured:<name>`, `inline`, or None: unknown)."""
    lines = [f"# convgate verification {md_text(verification_id)}", "", f"**{md_text(report['verdict'])}**", "",
             policy_origin_line(origin), "",
             f"Artifact: {md_code(report['artifact']['uri'])} sha256 {md_code(report['artifact']['sha256'])}"
             if report.get("artifact") else "Artifact: (not fetched)", "", *_gate_lines(report), ""]
    if report["blockers"]:
        lines += ["## Blockers", ""]
        lines += [f"- {md_code(b['code'])} ({md_text(b['gate'])}) {md_text(b.get('tensor') or '')} {md_text(b['why'])}"
                  for b in report["blockers"]]
        lines.append("")
    return "\n".join(lines + model_card(report, origin)) + "\n"


def render_markdown(markdown: str) -> str:
    """Our Markdown as an HTML fragment by markdown-it: CommonMark with tables, raw HTML off (shown as
    text) and no linkify, so only the markup this module wrote becomes elements."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": False}).enable("table").render(markdown)


def to_html(verification_id: str, report: dict[str, Any], origin: str | None = None) -> str:
    """The Markdown report as a standalone page. markdown-it's HTML is the one piece of markup a template is
    given as safe: it escaped every character of the text it was given, and that text came from this module,
    where every submitted string is inert."""
    from markupsafe import Markup

    from service.templating import render

    body = Markup(render_markdown(to_markdown(verification_id, report, origin)))
    return render("report.html", verification_id=verification_id, body=body)
