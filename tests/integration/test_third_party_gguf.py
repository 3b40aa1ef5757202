"""A GGUF nobody here wrote (SmolLM2 Q4_1, llama arch): our parser agrees with gguf-py's reader, and
gguf-py and libggml dequantize every quantized tensor identically on sampled rows."""

from __future__ import annotations

import pytest
from gguf import GGUFReader

from engine.formats.gguf_structure import read_layout
from engine.gates.storage.tensor_values import readers_agree

pytestmark = pytest.mark.slow


def test_structure_matches_gguf_py(smollm):
    layout = read_layout(smollm)
    assert len(layout.tensors) == 272
    assert layout.metadata["general.architecture"] == "llama"
    reader = GGUFReader(smollm)
    theirs = [(t.name, t.tensor_type.value, int(t.data_offset), tuple(int(d) for d in t.shape)) for t in reader.tensors]
    ours = [(t.name, t.ggml_type.id, t.offset, t.shape) for t in layout.tensors]
    assert ours == theirs
    assert len(layout.metadata["tokenizer.ggml.tokens"]) == reader.fields["tokenizer.ggml.tokens"].data.__len__()


def test_readers_agree_on_every_quantized_tensor(smollm):
    import numpy as np

    layout = read_layout(smollm)
    data = np.memmap(smollm, dtype=np.uint8, mode="r")
    types = set()
    for info in layout.tensors:
        if not info.ggml_type.quantized:
            continue
        rows = info.n_elements // info.shape[0]
        raw = data[info.offset:info.offset + info.nbytes].reshape(rows, -1)
        assert readers_agree(raw, info, rows, 4), info.name
        types.add(info.ggml_type.name)
    assert types == {"Q4_1", "Q8_0"}
