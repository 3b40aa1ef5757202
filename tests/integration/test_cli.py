"""The CLI contract: last stdout line exactly GO/NO-GO, exit 0 / 1 / 2, no traceback on bad input."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gguf_bytes import GGUFBytes, gguf_string

pytestmark = pytest.mark.slow
CONVGATE = [sys.executable, "-m", "service"]


def convgate(*args: str | Path) -> subprocess.CompletedProcess[str]:
    command = [*CONVGATE, "verify", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)


def last_line(result: subprocess.CompletedProcess[str]) -> str:
    return result.stdout.rstrip("\n").splitlines()[-1]


def test_go_exits_zero_with_report(minilm, tmp_path):
    report = tmp_path / "r.json"
    result = convgate("--source", minilm / "source", "--artifact", minilm / "minilm-Q4_K_M.gguf",
                      "--gates", "1", "--report", report)
    assert result.returncode == 0, result.stdout + result.stderr
    assert last_line(result) == "GO"
    document = json.loads(report.read_text())
    assert document["verdict"] == "GO"
    assert document["policy"]["sha256"] and document["environment"]["gguf"]
    assert document["artifact"]["size"] == (minilm / "minilm-Q4_K_M.gguf").stat().st_size
    assert {f["uri"].rsplit("/", 1)[-1] for f in document["files"]} >= {"model.safetensors", "config.json"}


def test_a_gate_that_cannot_run_is_a_blocker_not_a_silent_go(minilm, tmp_path):
    source = tmp_path / "source"
    shutil.copytree(minilm / "source", source)
    (source / "tokenizer.json").unlink()
    result = convgate("--source", source, "--artifact", minilm / "minilm-F32.gguf", "--gates", "2", "--json")
    assert result.returncode == 1
    assert last_line(result) == "NO-GO"
    document = json.loads(result.stdout.rsplit("\n", 2)[0])
    assert [b["code"] for b in document["blockers"]] == ["verifier.reference_missing"]
    assert document["gates"]["runtime"]["status"] == "failed"


def test_wrong_sha256_is_no_go_and_the_file_is_not_used(minilm):
    result = convgate("--source", minilm / "source", "--artifact", minilm / "minilm-F16.gguf",
                      "--gates", "1", "--sha256", "0" * 64)
    assert result.returncode == 1 and last_line(result) == "NO-GO"
    assert "artifact.sha256_mismatch" in result.stdout
    assert "gate storage  not_run" in result.stdout


@pytest.mark.parametrize(
    ("name", "raw"),
    [("bad-magic", GGUFBytes(magic=b"GGML").build()), ("truncated", GGUFBytes().build()[:10]),
     ("huge-array", GGUFBytes(kvs=[gguf_string("k") + struct.pack("<iiQ", 9, 0, 1 << 40)]).build())],
)
def test_malformed_artifact_is_no_go_without_traceback(minilm, tmp_path, name, raw):
    artifact = tmp_path / f"{name}.gguf"
    artifact.write_bytes(raw)
    result = convgate("--source", minilm / "source", "--artifact", artifact, "--gates", "1")
    assert result.returncode == 1 and last_line(result) == "NO-GO"
    assert "gguf." in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_pickle_source_is_no_go(minilm, tmp_path):
    source = tmp_path / "source"
    shutil.copytree(minilm / "source", source)
    (source / "pytorch_model.bin").write_bytes(b"\x80\x04")
    result = convgate("--source", source, "--artifact", minilm / "minilm-F16.gguf", "--gates", "1")
    assert result.returncode == 1 and last_line(result) == "NO-GO"
    assert "source.unsafe_format" in result.stdout


@pytest.mark.parametrize(
    "args",
    [("--source", "/nonexistent", "--artifact", "x.gguf"),
     ("--source", ".", "--artifact", "ftp://127.0.0.1/x.gguf"),
     ("--source", ".", "--artifact", "pyproject.toml", "--gates", "4")],
    ids=["missing source", "unsupported scheme", "bad gates"],
)
def test_usage_errors_exit_two(args):
    result = convgate(*args)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr


def test_invalid_policy_file_exits_two(minilm, tmp_path):
    policy = tmp_path / "policy.json"
    policy.write_text('{"runtime": {"f32": {"min_cosine": 7}}}')
    result = convgate("--source", minilm / "source", "--artifact", minilm / "minilm-F16.gguf", "--policy", policy)
    assert result.returncode == 2 and "invalid policy" in result.stderr


# Peak-RSS budget of `convgate verify --gates 1` on the 87 MiB F32 MiniLM conversion. The
# interpreter with numpy/gguf/pydantic is ~110 MiB; mapped file pages touched while streaming
# count too. Loading source and GGUF fully into memory would add ~180 MiB on top.
RSS_BUDGET_MIB = 330


# The child reports its own VmHWM at exit: the high-water mark of the address space exec gave it. (The
# kernel's ru_maxrss is not that: exec folds in the parent's peak from the fork or vfork, so a test run
# after others have loaded torch into the pytest process would be charged ~2 GB it never used.)
MEASURE_ITSELF = """
import atexit, os, runpy, sys
def report():
    with open("/proc/self/status") as status, open(os.environ["PEAK_RSS_FILE"], "w") as out:
        out.write(next(line.split()[1] for line in status if line.startswith("VmHWM:")))
atexit.register(report)
sys.argv = ["convgate", *sys.argv[1:]]
runpy.run_module("service", run_name="__main__")
"""


def peak_rss_mib(args: list[str], tmp_path: Path) -> tuple[int, float]:
    """Exit code and peak RSS (VmHWM, as the child itself reads it at exit) of `python -m service ARGS`."""
    target = tmp_path / "peak-kib"
    env = dict(os.environ, PEAK_RSS_FILE=str(target))
    process = subprocess.run([sys.executable, "-c", MEASURE_ITSELF, *args], env=env, check=False,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return process.returncode, int(target.read_text()) / 1024


def test_gate1_streams_within_memory_budget(minilm, tmp_path):
    code, peak = peak_rss_mib(["verify", "--source", str(minilm / "source"),
                               "--artifact", str(minilm / "minilm-F32.gguf"), "--gates", "1"], tmp_path)
    assert code == 0
    assert 0 < peak < RSS_BUDGET_MIB, f"peak RSS {peak:.0f} MiB"


def test_a_bad_thread_setting_stops_before_any_work(minilm):
    env = {**os.environ, "CONVGATE_THREADS": "all"}
    command = [*CONVGATE, "verify", "--source", str(minilm / "source"), "--artifact",
               str(minilm / "minilm-F16.gguf"), "--gates", "1"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False, env=env)
    assert result.returncode == 2
    assert "CONVGATE_THREADS must be a positive integer" in result.stderr


def test_the_report_names_the_thread_budget(minilm):
    env = {**os.environ, "CONVGATE_THREADS": "1"}
    command = [*CONVGATE, "verify", "--source", str(minilm / "source"), "--artifact",
               str(minilm / "minilm-F16.gguf"), "--gates", "1", "--json"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False, env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.rsplit("\n", 2)[0])["environment"]["threads"] == "1"
