"""Generate the coverage table of docs/coverage.md from the tests that prove it.

Collects the suite (no test runs) with `--coverage-claims`, which writes every `coverage` mark
(`tests/coverage_marks.py`), and renders one row per architecture: the types an honest
conversion is proven GO for (without and with an importance matrix, and by which gates) and
the defects proven NO-GO. The suite itself makes the claims true: CI fails if any marked test
fails, and `tests/unit/test_coverage_table.py` fails if the table in docs/coverage.md is not this output.

    python scripts/coverage_table.py           # print the table and the README's limitations
    python scripts/coverage_table.py --write   # rewrite them in docs/coverage.md and README.md
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TABLE_DOC = REPO / "docs" / "coverage.md"
README = REPO / "README.md"
START, END = "<!-- coverage-table:start -->", "<!-- coverage-table:end -->"
LIMITS_START, LIMITS_END = "<!-- limitations:start -->", "<!-- limitations:end -->"
TYPE_ORDER = ("F32", "F16", "BF16", "Q8_0", "Q6_K", "Q5_0", "Q5_1", "Q5_K", "Q5_K_M", "Q4_0", "Q4_1", "Q4_K",
              "Q4_K_M", "Q3_K", "Q3_K_M", "Q2_K", "IQ4_NL", "IQ4_XS", "IQ3_S", "IQ3_XXS", "IQ2_S", "IQ2_XS",
              "IQ2_XXS", "IQ1_M", "IQ1_S", "TQ2_0", "TQ1_0", "MXFP4")


def collect_claims() -> list[dict[str, Any]]:
    """Every coverage mark of the collected suite, by collecting it in a subprocess."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "claims.json"
        subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
             f"--coverage-claims={out}", "tests"],
            cwd=REPO, check=True, stdout=subprocess.DEVNULL,
        )
        claims: list[dict[str, Any]] = json.loads(out.read_text())
    return claims


def _type_key(name: str) -> tuple[int, str]:
    return (TYPE_ORDER.index(name) if name in TYPE_ORDER else len(TYPE_ORDER), name)


def _gates(spec: str) -> str:
    return "+".join(part.strip() for part in spec.split(","))


def _types_cell(claims: list[dict[str, Any]]) -> str:
    """`F16, Q8_0 (gates 1+2); BF16 (gate 1)`: each type under the widest set of gates that proved it."""
    widest: dict[str, str] = {}
    for claim in claims:
        gates = _gates(claim["gates"])
        for name in claim["types"]:
            if len(gates) > len(widest.get(name, "")):
                widest[name] = gates
    by_gates: dict[str, list[str]] = defaultdict(list)
    for name in sorted(widest, key=_type_key):
        by_gates[widest[name]].append(name)
    parts = [f"{', '.join(types)} (gate{'s' if '+' in gates else ''} {gates})"
             for gates, types in sorted(by_gates.items(), key=lambda item: (-len(item[0]), item[0]))]
    return "; ".join(parts) or "—"


def render(claims: list[dict[str, Any]]) -> str:
    """The Markdown table, one row per architecture, sorted by name."""
    rows = defaultdict(list)
    for claim in claims:
        rows[claim["arch"]].append(claim)
    lines = ["| architecture | honest conversion → GO | imatrix quants → GO | defect → NO-GO | tests |",
             "|---|---|---|---|---|"]
    for arch in sorted(rows):
        arch_claims = rows[arch]
        plain = [c for c in arch_claims if c["proves"] == "GO" and not c["imatrix"]]
        imatrix = [c for c in arch_claims if c["proves"] == "GO" and c["imatrix"]]
        defects = sorted({f"{c['defect']}{' (imatrix)' if c['imatrix'] else ''}"
                          for c in arch_claims if c["proves"] == "NO-GO"})
        tests = len({c["test"] for c in arch_claims})
        lines.append(f"| {arch} | {_types_cell(plain)} | {_types_cell(imatrix)} | {'; '.join(defects) or '—'} "
                     f"| {tests} |")
    return "\n".join(lines)


def render_limitations(claims: list[dict[str, Any]]) -> str:
    """The README's limitations, from the same claims as the table, so the two cannot disagree: which
    architectures are mapped at all, and which types and architectures no test has taken through gate 2."""
    families = sorted({claim["arch"].split(" (")[0] for claim in claims})
    proven = [claim for claim in claims if claim["proves"] == "GO"]
    widest: dict[str, set[str]] = defaultdict(set)
    for claim in proven:
        for name in claim["types"]:
            widest[name] |= set(_gates(claim["gates"]).split("+"))
    gate1_only = sorted((name for name, gates in widest.items() if "2" not in gates), key=_type_key)
    models = [claim for claim in proven if "single tensors" not in claim["arch"]]  # not a model: one tensor each
    no_runtime = sorted({claim["arch"] for claim in models} - {
        claim["arch"] for claim in models if "2" in _gates(claim["gates"]).split("+")})
    lines = [f"- Only these GGUF architectures are mapped: {', '.join(families)}. Any other is NO-GO "
             "(`metadata.unsupported_architecture`), never a guess."]
    if gate1_only:
        lines.append("- Proven through gate 1 (storage) only, never through gate 2 (runtime): "
                     f"{', '.join(gate1_only)}.")
    if no_runtime:
        lines.append(f"- No test takes these architectures through gate 2: {', '.join(no_runtime)}.")
    return "\n".join(lines)


def replace_between(doc: str, start: str, end: str, text: str, where: Path) -> str:
    head, _, rest = doc.partition(start)
    _, found, tail = rest.partition(end)
    if not found:
        raise SystemExit(f"{where.relative_to(REPO)} has no {start} ... {end} section")
    return f"{head}{start}\n{text}\n{end}{tail}"


def replace_table(doc: str, table: str) -> str:
    return replace_between(doc, START, END, table, TABLE_DOC)


def between(doc: str, start: str, end: str) -> str:
    return doc.partition(start)[2].partition(end)[0].strip()


def current_table(doc: str) -> str:
    return between(doc, START, END)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true",
                        help="rewrite the table in docs/coverage.md and the limitations in README.md")
    args = parser.parse_args()
    claims = collect_claims()
    table, limitations = render(claims), render_limitations(claims)
    if args.write:
        TABLE_DOC.write_text(replace_table(TABLE_DOC.read_text(encoding="utf-8"), table), encoding="utf-8")
        README.write_text(replace_between(README.read_text(encoding="utf-8"), LIMITS_START, LIMITS_END,
                                          limitations, README), encoding="utf-8")
    print(table, limitations, sep="\n\n")


if __name__ == "__main__":
    main()
