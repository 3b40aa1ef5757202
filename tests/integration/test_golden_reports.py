"""Golden reports: the JSON the engine writes for a few fixtures, kept in `golden/`, so a change to how the
gates are organised (the gate registry, typed evidence) is shown to leave every verdict, blocker, figure and
field as it was. What varies by run is taken out before comparing: timings, the environment, the paths of
this machine; figures are kept at 4 significant digits and compared within FIGURE_TOLERANCE (relative): the
reference's float32 sums take another path on a CPU with other vector units (AVX-512 beside AVX2) and move
the fourth digit, which no change to the engine does alone. Keys must be the same, in the same order, so the
JSON written stays byte-compatible; every other value must be equal.

Regenerate after an intended change to the report: `.venv/bin/python tests/integration/test_golden_reports.py`.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

if __name__ == "__main__":  # run as a script: the repository's root on the path, as pytest puts it
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engine.report import Report
from engine.verification import LocalInputs, VerifyRequest, verify
from tests.conftest import SUITE_POLICY, built, defect_copy, fixtures_root

pytestmark = pytest.mark.slow
GOLDEN = Path(__file__).parent / "golden"
VOLATILE_KEYS = frozenset({"timings", "environment", "seconds"})
FIGURE_TOLERANCE = 1e-2
ENGLISH = ("The quick brown fox jumps over the lazy dog.",
           "How do I verify that a converted model matches the original weights?")


def _scramble(data: Any) -> None:
    data[: len(data) // 2] = data[: len(data) // 2][::-1].copy()


def _tiny_llama_q8_0(work: Path) -> Report:
    root = built("tiny-llama", "tiny-llama-Q4_K_M.gguf")
    return verify(VerifyRequest(texts=ENGLISH), LocalInputs(source=root / "source",
                                                            artifact=root / "tiny-llama-Q8_0.gguf"), SUITE_POLICY)


def _tiny_llama_scrambled(work: Path) -> Report:
    root = built("tiny-llama", "tiny-llama-Q4_K_M.gguf")
    twin = defect_copy(root / "tiny-llama-F32.gguf", work, "output.weight", _scramble)
    return verify(VerifyRequest(texts=ENGLISH), LocalInputs(source=root / "source", artifact=twin), SUITE_POLICY)


def _minilm_f16(work: Path) -> Report:
    root = built("minilm", "minilm-Q6_K.gguf")
    return verify(VerifyRequest(texts=ENGLISH), LocalInputs(source=root / "source", artifact=root / "minilm-F16.gguf"),
                  SUITE_POLICY)


def _wrong_digest(work: Path) -> Report:
    root = built("tiny-llama", "tiny-llama-Q4_K_M.gguf")
    return verify(VerifyRequest(expected_sha256="0" * 64),
                  LocalInputs(source=root / "source", artifact=root / "tiny-llama-F16.gguf"), SUITE_POLICY)


CASES: dict[str, Callable[[Path], Report]] = {
    "tiny-llama-Q8_0": _tiny_llama_q8_0,
    "tiny-llama-F32-scrambled-output": _tiny_llama_scrambled,
    "minilm-F16": _minilm_f16,
    "tiny-llama-F16-wrong-digest": _wrong_digest,
}


def normalised(value: Any, places: dict[str, str]) -> Any:
    """The report without what varies by run: volatile keys dropped, this machine's paths named by role,
    floats at 4 significant digits."""
    if isinstance(value, dict):
        return {key: normalised(item, places) for key, item in value.items() if key not in VOLATILE_KEYS}
    if isinstance(value, list):
        return [normalised(item, places) for item in value]
    if isinstance(value, str):
        for path, name in places.items():
            value = value.replace(path, name)
        return value
    if isinstance(value, float) and math.isfinite(value) and value != 0.0:
        return float(f"{value:.4g}")
    return value


def report_of(case: str, work: Path) -> Any:
    report = CASES[case](work)
    places = {str(work.absolute().as_uri()): "<work-uri>", str(work.absolute()): "<work>",
              str(fixtures_root().absolute().as_uri()): "<fixtures-uri>", str(fixtures_root().absolute()): "<fixtures>"}
    return normalised(json.loads(report.model_dump_json()), places)


def differences(found: Any, golden: Any, path: str = "") -> list[str]:
    """Where `found` departs from `golden`: keys missing, added or in another order, a list of another length,
    a value changed, or a figure further than FIGURE_TOLERANCE from the golden one."""
    if isinstance(golden, dict):
        if not isinstance(found, dict) or list(found) != list(golden):
            return [f"{path or '/'}: keys {list(found) if isinstance(found, dict) else found!r} != {list(golden)}"]
        return [line for key in golden for line in differences(found[key], golden[key], f"{path}/{key}")]
    if isinstance(golden, list):
        if not isinstance(found, list) or len(found) != len(golden):
            return [f"{path}: {found!r} != {golden!r}"]
        return [line for at, pair in enumerate(zip(found, golden, strict=True))
                for line in differences(*pair, f"{path}[{at}]")]
    if isinstance(golden, float) and type(found) is float:
        close = math.isclose(found, golden, rel_tol=FIGURE_TOLERANCE, abs_tol=1e-12)
        return [] if close else [f"{path}: {found!r} != {golden!r}"]
    return [] if type(found) is type(golden) and found == golden else [f"{path}: {found!r} != {golden!r}"]


def test_differences_name_what_changed_and_let_the_fourth_digit_move() -> None:
    golden = {"a": 1, "b": [0.1234, "x"], "c": {"d": True}}
    assert differences({"a": 1, "b": [0.1235, "x"], "c": {"d": True}}, golden) == []
    assert differences({"a": 1, "b": [0.13, "x"], "c": {"d": True}}, golden) == ["/b[0]: 0.13 != 0.1234"]
    assert differences({"b": [0.1234, "x"], "a": 1, "c": {"d": True}}, golden) == [
        "/: keys ['b', 'a', 'c'] != ['a', 'b', 'c']"]
    assert differences({"a": 1.0, "b": [0.1234], "c": {"d": 1}}, golden) == [
        "/a: 1.0 != 1", "/b: [0.1234] != [0.1234, 'x']", "/c/d: 1 != True"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_report_is_the_golden_one(case: str, tmp_path: Path) -> None:
    golden = json.loads((GOLDEN / f"{case}.json").read_text())
    assert not (found := differences(report_of(case, tmp_path), golden)), "\n".join(found)


if __name__ == "__main__":
    import tempfile

    GOLDEN.mkdir(exist_ok=True)
    for name in sorted(CASES):
        with tempfile.TemporaryDirectory() as work:
            (GOLDEN / f"{name}.json").write_text(json.dumps(report_of(name, Path(work)), indent=1) + "\n")
        print(f"wrote {GOLDEN / name}.json")
