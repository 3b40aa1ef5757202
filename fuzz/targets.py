"""The fuzz targets by name: what scripts/fuzz.py runs and tests/fuzz/test_corpus_replay.py replays."""

from __future__ import annotations

from fuzz import gguf_metadata, gguf_structure, safetensors_header, shard_index, source_configs
from fuzz.common import Target

TARGETS: dict[str, Target] = {
    "gguf_structure": gguf_structure.one_input,
    "gguf_metadata": gguf_metadata.one_input,
    "safetensors_header": safetensors_header.one_input,
    "shard_index": shard_index.one_input,
    "source_configs": source_configs.one_input,
}
