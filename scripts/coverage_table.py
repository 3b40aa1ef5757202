"""Generate the coverage table of docs/coverage.md from the tests that prove it.

Collects the suite (no test runs) with `--coverage-claims`, which writes every `coverage` mark
(`tests/coverage_marks.py`), and renders one row per architecture: the types an honest
conversion is proven GO for (without and with an importance matrix, and by which gates) and
the defects proven NO-GO. The suite itself makes the claims true: CI fails if any marked test
fails, and `tests/unit/test_coverage_table.py` fails if the table in docs/coverage.md is not this output.

    python scripts/coverage_table.py           # print the table
    python scripts/coverage_table.py --write   # rewrite it in docs/coverage.md
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
START, END = "<!-- coverage-table:start -->", "<!-- coverage-table:end -->"
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


def replace_table(doc: str, table: str) -> str:
    head, _, rest = doc.partition(START)
    _, found, tail = rest.partition(END)
    if not found:
        raise SystemExit(f"{TABLE_DOC.relative_to(REPO)} has no {START} ... {END} section")
    return f"{head}{START}\n{table}\n{END}{tail}"


def current_table(doc: str) -> str:
    return doc.partition(START)[2].partition(END)[0].strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the table in docs/coverage.md")
    args = parser.parse_args()
    table = render(collect_claims())
    if args.write:
        TABLE_DOC.write_text(replace_table(TABLE_DOC.read_text(encoding="utf-8"), table), encoding="utf-8")
    print(table)


if __name__ == "__main__":
    main()
