"""The files of one artifact: shard names to siblings and URIs, a report's shards read back, and the split's
one byte space (ShardedBytes) refusing what no tensor can be: a read across two shards."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.formats.artifact_files import (
    ShardedBytes,
    artifact_bytes,
    artifact_paths,
    file_range,
    other_shards_in,
    sibling_uri,
    split_shard_uris,
)
from engine.report import FileDigest, Report
from engine.summary import render_summary

FIRST = "https://cdn.example/org/m-00001-of-00003.gguf?sig=abc"


def test_a_first_shard_names_its_siblings_and_a_plain_file_only_itself(tmp_path: Path) -> None:
    assert [p.name for p in artifact_paths(tmp_path / "m-00001-of-00003.gguf")] == [
        "m-00001-of-00003.gguf", "m-00002-of-00003.gguf", "m-00003-of-00003.gguf"]
    assert artifact_paths(tmp_path / "m.gguf") == (tmp_path / "m.gguf",)
    assert artifact_paths(tmp_path / "m-00001-of-00001.gguf") == (tmp_path / "m-00001-of-00001.gguf",)


def test_sibling_uris_keep_the_query_and_never_exceed_the_name() -> None:
    assert sibling_uri(FIRST, "m-00002-of-00003.gguf") == "https://cdn.example/org/m-00002-of-00003.gguf?sig=abc"
    assert split_shard_uris(FIRST, 3) == [sibling_uri(FIRST, f"m-0000{n}-of-00003.gguf") for n in (2, 3)]
    assert split_shard_uris(FIRST, 9) == split_shard_uris(FIRST, 3)
    assert split_shard_uris("https://cdn.example/m.gguf", 3) == [] == split_shard_uris(FIRST, 1)


def test_a_reports_other_shards_are_the_files_right_after_the_artifact() -> None:
    shards = [FileDigest(uri=sibling_uri(FIRST, f"m-0000{n}-of-00003.gguf"), sha256=str(n) * 64, size=n)
              for n in (1, 2, 3)]
    source = FileDigest(uri="hf://org/src@" + "0" * 40 + "/config.json", sha256="c" * 64, size=9)
    files = [*shards, source]
    assert other_shards_in(FIRST, [f.uri for f in files[1:]]) == [0, 1]
    assert other_shards_in("https://cdn.example/m.gguf", [f.uri for f in files[1:]]) == []
    report = Report(verdict="GO", blockers=[], gates={}, policy={"values": {"version": "v"}, "sha256": "0" * 64},
                    artifact=shards[0], files=files, not_verified=[], environment={}, timings={})
    summary = render_summary(report)
    assert f"m-00002-of-00003.gguf  sha256 {'2' * 64}" in summary and "config.json" not in summary


def test_the_shards_bytes_are_one_space_and_no_read_spans_two(tmp_path: Path) -> None:
    paths = [tmp_path / f"m-0000{n}-of-00002.gguf" for n in (1, 2)]
    paths[0].write_bytes(bytes(range(10)))
    paths[1].write_bytes(bytes(range(10, 16)))
    space = artifact_bytes(paths[0])
    assert isinstance(space, ShardedBytes) and space.size == 16
    assert bytes(space[8:10]) == bytes([8, 9]) and bytes(space[10:16]) == bytes(range(10, 16))
    assert int(space[12]) == 12
    with pytest.raises(IndexError, match="span two shards"):
        space[9:11]
    with pytest.raises(IndexError):
        space[16]
    planted = artifact_bytes(paths[0], mode="c")
    planted[11] = 99
    assert int(planted[11]) == 99 and paths[1].read_bytes()[1] == 11  # copy-on-write: the file is unchanged
    assert isinstance(artifact_bytes(tmp_path / "m-00001-of-00002.gguf"), ShardedBytes)
    single = tmp_path / "plain.gguf"
    single.write_bytes(b"abc")
    assert isinstance(artifact_bytes(single), np.memmap)


def test_a_byte_of_the_artifact_is_found_in_its_file_for_the_read_ahead(tmp_path: Path) -> None:
    paths = [tmp_path / f"m-0000{n}-of-00002.gguf" for n in (1, 2)]
    paths[0].write_bytes(bytes(10))
    paths[1].write_bytes(bytes(6))
    split = artifact_bytes(paths[0])
    assert file_range(split, 0) == (str(paths[0]), 0) and file_range(split, 9) == (str(paths[0]), 9)
    assert file_range(split, 10) == (str(paths[1]), 0) and file_range(split, 15) == (str(paths[1]), 5)
    single = tmp_path / "plain.gguf"
    single.write_bytes(bytes(6))
    assert file_range(artifact_bytes(single), 4) == (str(single), 4)
    assert file_range(np.zeros(8, dtype=np.uint8), 4) is None  # bytes in memory: nothing to read ahead
