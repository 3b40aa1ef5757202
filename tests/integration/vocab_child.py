"""A child process for the pre-tokenizer sweep: loads GGUF vocabularies (no weights) and tokenizes texts.

llama.cpp aborts (GGML_ASSERT) on some renames of `tokenizer.ggml.pre` while tokenizing, which is why gate 2
runs it in a child; the sweep does the same, and a death here is what gate 2 reports as `runtime.crashed`.
Protocol: one JSON request per line on stdin ({"path": ..., "texts": [...]}), one JSON reply per line on
stdout: {"ids": {"<text index>,<add_special>,<parse_special>": [ids]}} or {"error": "..."}.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> int:
    from llama_cpp import Llama

    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # native output must not reach the replies
    for line in sys.stdin:
        request = json.loads(line)
        try:
            llm = Llama(request["path"], vocab_only=True, verbose=False)
        except (ValueError, RuntimeError) as exc:
            replies.write(json.dumps({"error": str(exc)}) + "\n")
            replies.flush()
            continue
        ids = {f"{i},{a},{p}": list(llm.tokenize(text.encode("utf-8"), add_bos=a, special=p))
               for i, text in enumerate(request["texts"]) for a in (True, False) for p in (True, False)}
        llm.close()
        replies.write(json.dumps({"ids": ids}) + "\n")
        replies.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
