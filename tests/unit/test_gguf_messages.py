"""The parser's messages, exactly: the `why` an operator reads for every malformed case and for a
valid file cut at every point where the message changes. Messages are part of the contract: each
must say what was being read and what the file declared."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.formats.ggml_types import ValueType
from engine.formats.gguf_structure import GGUFStructureError, parse_buffer
from tests.gguf_bytes import GGUFBytes, kv_array, kv_string
from tests.unit.test_gguf_structure import MALFORMED

WHY = {
    'bad magic': ("magic is b'FUGG', expected b'GGUF'", None),
    'version 0': ('GGUF version 0 is not supported (2 or 3)', None),
    'version 1': ('GGUF version 1 is not supported (2 or 3)', None),
    'version from the future': ('GGUF version 4 is not supported (2 or 3)', None),
    'byte-swapped': ('version reads as 50331648: the file is big-endian', None),
    'negative tensor count': ('tensor count -1 is negative, absurd or exceeds the file', None),
    'absurd kv count': ('key/value count 1099511627776 is negative, absurd or exceeds the file', None),
    'kv count beyond file': ('key/value count 1000 is negative, absurd or exceeds the file', None),
    'key size huge': ('key length 18446744073709551615 is empty or too long', None),
    'empty key': ('key length 0 is empty or too long', None),
    'key too long': ('key length 5000 is empty or too long', None),
    'duplicate key': ("key 'a' appears twice", None),
    'unknown value type': ("key 'k' has unknown value type 13", None),
    'nested array': ("array 'k' holds arrays", None),
    '2^40 array elements in ~100 bytes': ("array 'k' declares 1099511627776 elements, more than the file holds", None),
    'string longer than file': ("value of 'k' declares 8589934592 elements, more than the file holds", None),
    'alignment not power of two': ('general.alignment 13 is not a power of two', None),
    'alignment zero': ('general.alignment 0 is not a power of two', None),
    'alignment not u32': ('general.alignment has type INT32', None),
    'tensor name too long': ('tensor name length 64 is empty or too long', None),
    'tensor name empty': ('tensor name length 0 is empty or too long', None),
    'duplicate tensor name': ("tensor 'a' appears twice", 'a'),
    'n_dims 5': ("tensor 'a' has 5 dimensions", 'a'),
    'n_dims 0': ("tensor 'a' has 0 dimensions", 'a'),
    'negative dimension': ("tensor 'a' has negative dimension -1", 'a'),
    'element count overflows': ("tensor 'a' element count overflows", 'a'),
    'nbytes wraps when padded': ("tensor 'a' starts at 4611686018427388032, past the end (128)", 'a'),
    'unknown tensor type': ("tensor 'a' has unknown type 99", 'a'),
    'removed tensor type': ("tensor 'a' has unknown type 4", 'a'),
    'row not a multiple of block': ("tensor 'a' row length 30 is not a multiple of Q8_0's block size 32", 'a'),
    'offset misaligned': ("tensor 'b' offset 33 is not a multiple of 32", 'b'),
    'tensors overlap': ("tensor 'b' overlaps 'a'", 'b'),
    'tensors out of order': ("tensor 'c' is stored before 'b'", 'c'),
    'gap between tensors': ("32 unexplained bytes before tensor 'b'", 'b'),
    'tensor beyond the end': ("tensor 'a' starts at 1048704, past the end (128)", 'a'),
    'two huge I8 tensors (mem size overflow)': ("tensor 'a' needs 9223372036854775744 bytes, 0 are left", 'a'),
    'truncated data': ("tensor 'a' needs 32 bytes, 24 are left", 'a'),
    'truncated header': ('file ends while reading key/value count', None),
    'trailing garbage': ('64 bytes after the last tensor', None),
    'tokens not strings': ('tokenizer.ggml.tokens is not an array of strings', None),
    'scores wrong length': ('tokenizer.ggml.scores has 2 entries for 3 tokens', None),
    'token types wrong element type': ('tokenizer.ggml.token_type is not an array of INT32', None),
    'merges not strings': ('tokenizer.ggml.merges is not an array of strings', None),
    'bos id outside vocabulary': ('tokenizer.ggml.bos_token_id=3 is not a token of the vocabulary', None),
}
CUTS = {
    0: 'file ends while reading magic',
    4: 'file ends while reading version',
    8: 'file ends while reading tensor count',
    16: 'file ends while reading key/value count',
    24: 'tensor count 1 is negative, absurd or exceeds the file',
    57: "file ends while reading length of value of 'general.architecture'",
    64: "value of 'general.architecture' declares 1 elements, more than the file holds",
    65: 'file ends while reading key length',
    73: 'key length 1 is empty or too long',
    74: "file ends while reading type of 'a'",
    78: 'file ends while reading array type of a',
    82: "file ends while reading length of array 'a'",
    90: "array 'a' declares 2 elements, more than the file holds",
    98: '1 tensors cannot fit in the rest of the file',
    131: "tensor 'w' starts at 160, past the end (131)",
    159: "tensor 'w' starts at 160, past the end (159)",
    160: "tensor 'w' needs 32 bytes, 0 are left",
    191: "tensor 'w' needs 32 bytes, 31 are left",
}


def _why(raw: bytes) -> tuple[str, str | None]:
    with pytest.raises(GGUFStructureError) as info:
        parse_buffer(raw, Path("t.gguf"))
    return info.value.why, info.value.tensor


@pytest.mark.parametrize(("name", "raw"), [(n, r) for n, _, r in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_each_malformed_case_says_why(name: str, raw: bytes) -> None:
    assert _why(raw) == WHY[name]


VALID = GGUFBytes(kvs=[kv_string("general.architecture", "t"), kv_array("a", ValueType.INT32, [1, 2])]
                  ).with_f32_tensors(("w", 8)).build()


@pytest.mark.parametrize(("cut", "why"), sorted(CUTS.items()))
def test_a_file_cut_short_says_where(cut: int, why: str) -> None:
    assert _why(VALID[:cut])[0] == why


def test_the_uncut_file_parses() -> None:
    assert [t.name for t in parse_buffer(VALID, Path("t.gguf")).tensors] == ["w"]
