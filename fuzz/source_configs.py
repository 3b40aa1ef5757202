"""Fuzz target: config.json, tokenizer.json and the sentence-transformers configs, through gate 1.

The first byte picks the file the rest of the input replaces in an honest source; then the source
is opened, gate 1 judges the honest GGUF against it, and the sentence-transformers config is read
the way gates 2 and 3 read it.
"""

from __future__ import annotations

import json

from engine.formats.source import open_source
from engine.runtime.sentence_config import sentence_config
from fuzz.common import gate1, honest_copy, main

FILES = ("tokenizer.json", "tokenizer_config.json", "modules.json", "config_sentence_transformers.json",
         "1_Pooling/config.json", "config.json", "chat_template.jinja")
POOLING_MODULES = [{"type": "sentence_transformers.models.Pooling", "path": "1_Pooling"}]


def one_input(data: bytes) -> None:
    if not data:
        return
    relative = FILES[data[0] % len(FILES)]
    source, artifact = honest_copy("source_configs")
    if relative.startswith("1_Pooling/"):
        (source / "modules.json").write_text(json.dumps(POOLING_MODULES))
    path = source / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data[1:])
    gate1(source, artifact)
    sentence_config(open_source(source))


if __name__ == "__main__":
    main(one_input)
