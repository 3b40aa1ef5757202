"""A gguf-split artifact verified as one model, named by its first shard as llama.cpp is given it.

- An honest 3-shard split of the trained SmolLM2's Q4_K_M is GO on all three gates: gate 1 checks every
  tensor of the union, gate 2 loads the first shard in llama.cpp, gate 3 re-reads every shard, and the report
  digests every shard.
- Each split defect is NO-GO with its named blocker: a missing shard, a shard from another split, a tensor in
  two shards, a shard whose `split.no` disagrees with its name, one shard tampered with (gate 1 names the
  tensor; a pinned digest names the shard).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from engine.digests import sha256_file
from engine.formats.artifact_files import read_artifact
from engine.formats.gguf_structure import read_layout
from engine.summary import render_summary
from tests.conftest import codes, run_gates
from tests.gguf_split_writer import resplit, write_groups

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def llama_split(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return resplit(tiny_llama / "tiny-llama-Q8_0.gguf", tmp_path_factory.mktemp("split") / "tiny-llama-Q8_0.gguf", 3)


def copy_split(shards: list[Path], folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    return [Path(shutil.copyfile(shard, folder / shard.name)) for shard in shards]


@pytest.mark.coverage(arch="llama", types=("Q4_K_M",), imatrix=False, proves="GO", gates="1,2,3")
def test_an_honest_split_of_a_trained_model_is_go_on_every_gate(smollm2: Path, tmp_path: Path) -> None:
    single = smollm2 / "smollm2-Q4_K_M.gguf"
    shards = resplit(single, tmp_path / "smollm2-Q4_K_M.gguf", 3)
    pinned = tuple(sha256_file(shard) for shard in shards)
    report = run_gates(smollm2 / "source", shards[0], {1, 2, 3}, shard_sha256=pinned)
    assert report.verdict == "GO", report.blockers
    assert [f.sha256 for f in report.files[:3]] == list(pinned)
    assert [f.uri.rsplit("/", 1)[-1] for f in report.files[:3]] == [shard.name for shard in shards]
    assert report.artifact is not None and report.artifact.sha256 == pinned[0]
    checked = {row["gguf_name"] for row in report.gates["storage"].details["tensors"]}
    assert checked == {info.name for info in read_layout(single).tensors}
    assert [f["sha256"] for f in report.gates["release"].details["package"]] == list(pinned)
    summary = render_summary(report)
    assert all(f"{shard.name}  sha256 {sha}" in summary for shard, sha in zip(shards[1:], pinned[1:], strict=True))


def test_the_union_layout_reads_the_same_bytes_as_the_single_file(tiny_llama: Path, llama_split: list[Path]) -> None:
    from engine.formats.artifact_files import artifact_bytes

    single = read_layout(tiny_llama / "tiny-llama-Q8_0.gguf")
    union = read_artifact(llama_split[0])
    assert not isinstance(union, tuple), union
    assert "split.count" not in union.metadata and union.metadata["general.architecture"] == "llama"
    whole, split = artifact_bytes(tiny_llama / "tiny-llama-Q8_0.gguf"), artifact_bytes(llama_split[0])
    for info in single.tensors:
        there = union.tensor(info.name)
        assert bytes(split[there.offset:there.offset + there.nbytes]) == \
            bytes(whole[info.offset:info.offset + info.nbytes])


def test_an_honest_split_is_go_on_gate_1_like_its_single_file(tiny_llama: Path, llama_split: list[Path]) -> None:
    report = run_gates(tiny_llama / "source", llama_split[0], {1})
    assert report.verdict == "GO", report.blockers
    assert len(report.gates["storage"].details["tensors"]) == len(read_layout(tiny_llama / "tiny-llama-Q8_0.gguf")
                                                                  .tensors)


@pytest.mark.coverage(arch="llama", types=("Q8_0",), imatrix=False, proves="NO-GO", gates="1",
                      defect="a split with a shard missing")
def test_a_missing_shard_is_no_go(tiny_llama: Path, llama_split: list[Path], tmp_path: Path) -> None:
    shards = copy_split(llama_split, tmp_path)
    shards[2].unlink()
    report = run_gates(tiny_llama / "source", shards[0], {1, 2, 3})
    assert report.verdict == "NO-GO" and codes(report) == {"artifact.split_missing_shard"}
    assert shards[2].name in report.blockers[0].why


@pytest.mark.coverage(arch="llama", types=("Q8_0",), imatrix=False, proves="NO-GO", gates="1",
                      defect="a shard of another split")
def test_a_shard_from_another_split_is_no_go(tiny_llama: Path, qwen3: Path, llama_split: list[Path],
                                            tmp_path: Path) -> None:
    (tmp_path / "other").mkdir()
    other = resplit(qwen3 / "tiny-qwen3-F16.gguf", tmp_path / "other" / "tiny-qwen3-F16.gguf", 3)
    shards = copy_split(llama_split, tmp_path / "mixed")
    shutil.copyfile(other[1], shards[1])
    report = run_gates(tiny_llama / "source", shards[0], {1})
    assert report.verdict == "NO-GO" and "artifact.split_foreign_shard" in codes(report)


@pytest.mark.coverage(arch="llama", types=("Q8_0",), imatrix=False, proves="NO-GO", gates="1",
                      defect="a tensor in two shards")
def test_a_tensor_in_two_shards_is_no_go(tiny_llama: Path, tmp_path: Path) -> None:
    single = tiny_llama / "tiny-llama-Q8_0.gguf"
    names = [info.name for info in read_layout(single).tensors]
    third = len(names) // 3
    groups = [names[:third], [*names[third:2 * third], names[0]], names[2 * third:]]
    shards = write_groups(single, tmp_path / "tiny-llama-Q8_0.gguf", groups, total=len(names))
    report = run_gates(tiny_llama / "source", shards[0], {1})
    assert report.verdict == "NO-GO" and "artifact.split_duplicate_tensor" in codes(report)
    assert any(b.tensor == names[0] for b in report.blockers)


@pytest.mark.coverage(arch="llama", types=("Q8_0",), imatrix=False, proves="NO-GO", gates="1",
                      defect="a shard whose split.no disagrees with its name")
def test_shards_swapped_under_their_names_are_no_go(tiny_llama: Path, llama_split: list[Path],
                                                    tmp_path: Path) -> None:
    shards = copy_split(llama_split, tmp_path)
    swap = tmp_path / "swap"
    shards[1].rename(swap)
    shards[2].rename(shards[1])
    swap.rename(shards[2])
    report = run_gates(tiny_llama / "source", shards[0], {1})
    assert report.verdict == "NO-GO" and codes(report) == {"artifact.split_index_mismatch"}


@pytest.mark.coverage(arch="llama", types=("Q8_0",), imatrix=False, proves="NO-GO", gates="1",
                      defect="one shard's tensor bytes changed")
def test_one_tampered_shard_is_no_go_by_value_and_by_its_pinned_digest(tiny_llama: Path, llama_split: list[Path],
                                                                      tmp_path: Path) -> None:
    pinned = tuple(sha256_file(shard) for shard in llama_split)
    shards = copy_split(llama_split, tmp_path)
    last = read_layout(shards[2])
    info = max(last.tensors, key=lambda t: t.nbytes)
    raw = bytearray(shards[2].read_bytes())
    raw[info.offset + info.nbytes // 2] ^= 0x10
    shards[2].write_bytes(bytes(raw))

    measured = run_gates(tiny_llama / "source", shards[0], {1})
    assert measured.verdict == "NO-GO"
    assert any(b.tensor == info.name and b.code.startswith("tensor.") for b in measured.blockers), measured.blockers

    refused = run_gates(tiny_llama / "source", shards[0], {1, 2, 3}, shard_sha256=pinned)
    assert refused.verdict == "NO-GO" and codes(refused) == {"artifact.sha256_mismatch"}
    assert [b.why.split(" sha256")[0] for b in refused.blockers] == ["shard 3"]


def test_a_split_pinned_by_too_few_digests_is_refused_whole(tiny_llama: Path, llama_split: list[Path]) -> None:
    pinned = tuple(sha256_file(shard) for shard in llama_split[:2])
    report = run_gates(tiny_llama / "source", llama_split[0], {1}, shard_sha256=pinned)
    assert report.verdict == "NO-GO" and codes(report) == {"artifact.sha256_mismatch"}
    assert "2 shard digests were pinned for a 3-file artifact" in report.blockers[0].why
