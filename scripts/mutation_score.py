#!/usr/bin/env python3
"""Mutation score of the checks that decide a verdict: run mutmut on one set of modules and print,
per mutated file, the share of mutants the tests kill.

A mutant nobody's test notices ("survived" or "no tests") is a check that could be deleted with every
test still green. The target is at least 90% killed for every file listed; exit status 1 below it.

mutmut writes its mutants into `./mutants` of the tree it runs in, so each set runs in its own copy
of the repository (under the system temp folder, or --workdir): two sets, or a developer editing
the tree, never see each other's mutants. The sets are the table below; `[tool.mutmut]` in
pyproject.toml is only the template the copy's settings are written into.

Usage: python scripts/mutation_score.py [--set NAME|all] [--no-run] [--target 0.9]   (NAME: a key of SETS)
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINE = re.compile(r"^\s*(?P<module>[\w.]+?)\.x[\u01c1_]\S*__mutmut_\d+: (?P<status>[\w ]+)$")
COPY_IGNORE = shutil.ignore_patterns(".venv", "mutants", ".fixtures", ".git", ".convgate", "__pycache__",
                                     ".mypy_cache", ".ruff_cache", "*.gguf", "*.safetensors")


@dataclass(frozen=True)
class MutationSet:
    source_paths: tuple[str, ...]
    modules: tuple[str, ...]
    tests: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()  # what the set's tests need beyond the defaults (main's env)
    # a test running longer fails (pytest-timeout): a mutant that loops forever is killed by the first test
    # it hangs, rather than left to mutmut's CPU limit (minutes, scored as a timeout, not a kill)
    test_timeout_s: int | None = None


SETS = {
    "engine": MutationSet(
        ("engine",),
        ("engine/formats/gguf_structure.py", "engine/gates/storage/tensor_values.py",
         "engine/gates/storage/metadata_check.py", "engine/gates/storage/tokenizer_metadata.py",
         "engine/gates/hyperparameters.py", "engine/policy.py", "engine/blockers.py"),
        ("tests/unit/",)),
    "lifecycle": MutationSet(
        ("service",),
        ("service/persistence/repository.py", "service/lifecycle.py"),
        ("tests/service/test_lifecycle.py", "tests/service/test_lifecycle_races.py",
         "tests/service/test_lifecycle_loop.py", "tests/service/test_persistence.py",
         "tests/service/test_lifecycle_properties.py", "tests/service/test_lifecycle_queries.py")),
    "edge": MutationSet(
        ("edge",),
        ("edge/uri_policy.py", "edge/addresses.py", "edge/transport.py", "edge/retry.py"),
        ("tests/service/test_uri_policy.py", "tests/integration/test_fetch.py",
         "tests/integration/test_file_roots.py")),
    "coverage": MutationSet(
        ("engine",),
        ("engine/gates/architectures/derived.py", "engine/gates/inventory.py", "engine/gates/storage/systematic.py",
         "engine/acceptance.py", "engine/quant/imatrix.py"),
        ("tests/unit/test_derived_tensors.py", "tests/unit/test_inventory_derivations.py",
         "tests/unit/test_reproduction_outcomes.py", "tests/unit/test_imatrix_files.py")),
    "signatures": MutationSet(
        ("engine",),
        ("engine/oms.py", "engine/signature_check.py"),
        ("tests/unit/test_oms.py", "tests/unit/test_signature_check.py")),
    "grid": MutationSet(
        ("engine",),
        ("engine/quant/grid_bounds.py",),
        ("tests/unit/test_grid_bounds.py",)),
    "scale": MutationSet(
        ("engine", "service"),
        ("engine/resources.py", "engine/quant/sampling.py", "service/persistence/shards.py"),
        ("tests/unit/test_resources.py", "tests/unit/test_sampling.py", "tests/service/test_local_threads.py",
         "tests/service/test_gate1_shards.py", "tests/integration/test_shards.py",
         "tests/integration/test_sampled_reproduction.py")),
    "fences": MutationSet(  # the URI fences of the last two rounds (issues 22 and 34)
        ("edge", "service"),
        ("edge/redact.py", "edge/uri_policy.py", "service/persistence/reuse.py"),
        ("tests/unit/test_redact_uri.py", "tests/unit/test_redact_properties.py",
         "tests/unit/test_redact_entry_points.py", "tests/service/test_uri_policy.py", "tests/service/test_reuse.py"),
        # the redaction property draws 10^5 URIs in the suite; a few thousand still find a broken rule
        (("CONVGATE_REDACT_URIS", "3000"),), test_timeout_s=120),
    "callbacks": MutationSet(  # completion callbacks: what is sent, when, to whom, within what deadline
        ("edge", "service"),
        ("service/callbacks.py", "service/callbacks_loop.py", "service/persistence/callbacks.py", "edge/deadline.py"),
        ("tests/unit/test_deadline.py", "tests/service/test_callbacks.py", "tests/service/test_callback_fairness.py")),
    "retrieval": MutationSet(  # the labelled retrieval set's figures and its decisive-pair order (issue 37)
        ("engine",),
        ("engine/gates/runtime/labelled_retrieval.py",),
        ("tests/unit/test_labelled_retrieval.py",)),
    "reproduction": MutationSet(  # gate 1's re-quantization: which input precision, which blocks differ (issue 32)
        ("engine",),
        ("engine/gates/storage/reproduction.py",),
        ("tests/unit/test_reproduction_reuse.py", "tests/unit/test_gate1_passes.py", "tests/unit/test_tensor_values.py",
         "tests/unit/test_tensor_check.py", "tests/unit/test_sampling.py", "tests/unit/test_quant_types.py",
         "tests/unit/test_reproduction_outcomes.py")),
    "noise": MutationSet(  # gate 2's distance thresholds widened to a model's own rounding noise (issue 33)
        ("engine",),
        ("engine/gates/runtime/compute_noise.py", "engine/runtime/activation_rounding.py"),
        ("tests/unit/test_compute_noise.py",)),
    "submission": MutationSet(  # the submission's statements on the driver, and what it writes (issue 34)
        ("service",),
        ("service/persistence/driver.py", "service/persistence/submission_insert.py"),
        ("tests/service/test_submission_driver.py", "tests/service/test_api_latency.py",
         "tests/service/test_submission_route.py", "tests/service/test_database_reconnect.py"),
        test_timeout_s=60),  # Postgres: CONVGATE_TEST_PG, as for the suite
    "listing": MutationSet(  # the auditor's page: its filters, its driver statement and access-log row (issue 34)
        ("service",),
        ("service/persistence/listing.py", "service/api/declared.py"),
        ("tests/service/test_listing_driver.py", "tests/service/test_list_route.py",
         "tests/service/test_lifecycle_queries.py", "tests/service/test_access_log.py",
         "tests/service/test_exports.py", "tests/service/test_api_latency.py"),
        test_timeout_s=60),
    "scale-gates": MutationSet(  # integration tests only: hours on 2 cores
        ("engine",),
        ("engine/gates/storage/value_checks.py", "engine/gates/storage/parts.py", "engine/runtime/streamed_model.py"),
        ("tests/integration/test_gate1_pool.py", "tests/integration/test_shards.py",
         "tests/integration/test_streamed_reference.py",
         # a peak-memory budget means nothing under mutmut's trampolines (it reads 20 MiB over)
         "--deselect=tests/integration/test_streamed_reference.py::"
         "test_streamed_reference_peak_is_within_the_budget_from_the_shapes")),
}


def scores(results: str) -> dict[str, Counter[str]]:
    per_module: dict[str, Counter[str]] = defaultdict(Counter)
    for line in results.splitlines():
        if match := LINE.match(line):
            per_module[match["module"]][match["status"].strip()] += 1
    return per_module


def _toml_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f'"{value}"' for value in values) + "]"


def prepare(name: str, chosen: MutationSet, workdir: Path) -> Path:
    """A copy of the repository whose [tool.mutmut] names this set (the copy is reused on --no-run)."""
    tree = workdir / f"convgate-mutation-{name}"
    timeout = () if chosen.test_timeout_s is None else (f"--timeout={chosen.test_timeout_s}",)
    if tree.exists():
        shutil.rmtree(tree)
    shutil.copytree(ROOT, tree, ignore=COPY_IGNORE)
    pyproject = tree / "pyproject.toml"
    text = pyproject.read_text(encoding="utf-8")
    head, _, _ = text.partition("[tool.mutmut]")
    section = (
        "[tool.mutmut]\n"
        f"source_paths = {_toml_list(chosen.source_paths)}\n"
        f"only_mutate = {_toml_list(chosen.modules)}\n"
        f"pytest_add_cli_args_test_selection = {_toml_list(chosen.tests)}\n"
        'also_copy = ["tests", "service", "scripts", "engine", "edge", "migrations", "alembic.ini", "fuzz", "docs", '
        '"README.md", "examples", "deploy", "manifests"]\n'
        f'pytest_add_cli_args = {_toml_list(("-p", "no:cacheprovider", "-q", "-x", *timeout))}\n'
    )
    pyproject.write_text(head + section, encoding="utf-8")
    return tree


def run_set(name: str, args: argparse.Namespace) -> bool:
    """Run one set; True when every module reaches the target."""
    mutmut = Path(sys.executable).parent / "mutmut"
    env = dict(os.environ, CONVGATE_FIXTURES=os.environ.get("CONVGATE_FIXTURES", str(ROOT / ".fixtures")),
               CONVGATE_PROPERTY_EXAMPLES=os.environ.get("CONVGATE_PROPERTY_EXAMPLES", "5"))
    env.update(SETS[name].env)
    tree = args.workdir / f"convgate-mutation-{name}"
    if not args.no_run:
        tree = prepare(name, SETS[name], args.workdir)
        subprocess.run([mutmut, "run", "--max-children", str(os.cpu_count() or 1)], cwd=tree, env=env, check=False)
    results = subprocess.run([mutmut, "results", "--all", "true"], cwd=tree, env=env, check=True,
                             capture_output=True, text=True).stdout
    below = False
    print(f"\n### {name}\n\n| module | mutants | killed | survived | no tests | other | killed % |\n"
          "|---|---|---|---|---|---|---|")
    for module, counts in sorted(scores(results).items()):
        total = sum(counts.values())
        killed = counts["killed"]
        other = total - killed - counts["survived"] - counts["no tests"]
        share = killed / total if total else 0.0
        below |= share < args.target
        print(f"| {module} | {total} | {killed} | {counts['survived']} | {counts['no tests']} | {other} | "
              f"{share:.1%} |")
    return not below


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", choices=[*SETS, "all"], default="all")
    parser.add_argument("--no-run", action="store_true", help="only report the last run's results")
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()))
    args = parser.parse_args()
    names = list(SETS) if args.set == "all" else [args.set]
    passed = [run_set(name, args) for name in names]
    return 0 if all(passed) else 1


if __name__ == "__main__":
    sys.exit(main())
