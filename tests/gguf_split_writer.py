"""gguf-split artifacts for tests, written by gguf-py (not by our own parser): a fixture re-written as
shards exactly as `GGUFWriter(split_max_tensors=...)` and llama.cpp's `gguf-split` lay them out."""

from __future__ import annotations

import math
from pathlib import Path

import gguf
import numpy as np


def copy_metadata(reader: gguf.GGUFReader, writer: gguf.GGUFWriter) -> None:
    """Every key/value pair of `reader`'s file but the architecture (the writer's own) and the header's."""
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), value_type, sub_type=sub_type)


def finish(writer: gguf.GGUFWriter) -> None:
    """Write what was added (every shard, for a split writer) and close."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def resplit(src: Path, dst: Path, shards: int) -> list[Path]:
    """`src` re-written as `shards` shards by gguf-py: every key/value pair and every tensor's bytes copied."""
    reader = gguf.GGUFReader(src)
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE)
    assert arch is not None
    writer = gguf.GGUFWriter(dst, str(arch.contents()),
                             split_max_tensors=math.ceil(len(reader.tensors) / shards))
    copy_metadata(reader, writer)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, np.array(tensor.data), raw_dtype=tensor.tensor_type)
    names = writer.format_shard_names(dst)
    finish(writer)
    return names


def write_groups(src: Path, dst: Path, groups: list[list[str]], *, total: int | None = None) -> list[Path]:
    """`src`'s tensors written as one shard per group of names (a name may be in two groups, a defect), each
    shard named and keyed as gguf-split does; every key/value pair in the first shard only. `total` overrides
    `split.tensors.count`."""
    reader = gguf.GGUFReader(src)
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE)
    assert arch is not None
    by_name = {tensor.name: tensor for tensor in reader.tensors}
    count = len(groups)
    paths = [dst.with_name(f"{dst.stem}-{number:05d}-of-{count:05d}.gguf") for number in range(1, count + 1)]
    for number, (path, names) in enumerate(zip(paths, groups, strict=True)):
        writer = gguf.GGUFWriter(path, str(arch.contents()))
        if number == 0:
            copy_metadata(reader, writer)
        writer.add_uint16(gguf.Keys.Split.LLM_KV_SPLIT_NO, number)
        writer.add_uint16(gguf.Keys.Split.LLM_KV_SPLIT_COUNT, count)
        writer.add_int32(gguf.Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT,
                         total if total is not None else len({name for group in groups for name in group}))
        for name in names:
            writer.add_tensor(name, np.array(by_name[name].data), raw_dtype=by_name[name].tensor_type)
        finish(writer)
    return paths
