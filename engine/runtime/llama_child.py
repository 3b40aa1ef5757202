"""The llama.cpp child: loads one GGUF and answers the verifier's calls over its stdin and stdout.

Why a process of its own: llama.cpp parses a hostile file in native code. An `abort()` on a metadata
value it does not expect, a segfault, or an allocation the pod cannot hold would otherwise end the
whole verification without a verdict. Here they end this process only; the verifier sees the signal
and records it as a blocker. The child caps its own private memory (RLIMIT_DATA, which counts heap and
anonymous maps but not the read-only map of the GGUF) before llama.cpp is imported, so a file that
asks for an absurd buffer fails inside the child, not in the pod.

Started as `python -m engine.runtime.llama_child`. The first frame opens the model; every later frame
is one call (see `CALLS`); end of input or a `close` call ends the process. Output that native code
writes to stdout would corrupt the frames, so the frames use a private duplicate of stdout and fd 1 is
pointed at stderr.
"""

from __future__ import annotations

import os
import resource
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import numpy as np

from engine.runtime.wire import read_frame, write_frame

Reply = tuple[Any, tuple[np.ndarray, ...]]


def _limit_private_memory(limit: int | None) -> None:
    if limit:
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


def _top1(candidate: Any, ids: list[int]) -> Reply:
    top, finite = candidate.top1(ids)
    return finite, (top,)


def _calls(candidate: Any) -> dict[str, Callable[..., Reply]]:
    """Each call's name -> what it does with the candidate; arrays travel as arrays, the rest as JSON."""
    return {
        "tokenize": lambda text, add_special, parse_special: (
            candidate.tokenize(text, add_special=add_special, parse_special=parse_special), ()),
        "embed": lambda text: (None, (candidate.embed(text),)),
        "logits": lambda ids: (None, (candidate.logits(ids).astype(np.float32),)),
        "logits_rows": lambda segments: (None, (np.concatenate([candidate.logits_rows(ids, start, stop)
                                                                for ids, start, stop in segments]),)),
        "top1": lambda ids: _top1(candidate, ids),
        "pair_tokens": lambda query, document: (candidate.pair_tokens(query, document), ()),
        "rank_scores": lambda tokens: (None, (candidate.rank_scores(tokens),)),
        "n_embd": lambda: (candidate.n_embd, ()),
        "n_vocab": lambda: (int(candidate.llm.n_vocab()), ()),
        "trace_layers": lambda architecture, ids: (None, (candidate.trace_layers(architecture, ids),)),
        "render_chat": lambda messages, add_generation_prompt, source_dir: (
            candidate.render_chat(messages, add_generation_prompt, source_dir), ()),
        "vocab": lambda: (candidate.vocab_facts(), ()),
    }


def serve(requests: IO[bytes], replies: IO[bytes]) -> int:
    """Open the model named by the first frame, then answer calls until the input ends."""
    from engine.errors import ReferenceMissingError
    from engine.runtime.llama_candidate import CandidateLoadError, LlamaCandidate

    opening, _ = read_frame(requests)
    try:
        candidate = LlamaCandidate(Path(opening["path"]), embedding=bool(opening["embedding"]),
                                   n_ctx=int(opening["n_ctx"]), rank=bool(opening["rank"]),
                                   batch=int(opening["batch"]) if opening.get("batch") else None)
    except CandidateLoadError as exc:
        write_frame(replies, {"ok": False, "error": "load", "message": str(exc)})
        return 0
    except ReferenceMissingError as exc:
        write_frame(replies, {"ok": False, "error": "reference_missing", "message": str(exc)})
        return 0
    write_frame(replies, {"ok": True, "value": None})
    calls = _calls(candidate)
    while True:
        try:
            request, _ = read_frame(requests)
        except EOFError:
            return 0
        name = str(request.get("call"))
        if name == "close":
            candidate.close()
            return 0
        try:
            value, arrays = calls[name](**request.get("args", {}))
        except Exception as exc:  # every failure goes back to the verifier as a reply, named
            write_frame(replies, {"ok": False, "error": type(exc).__name__, "message": str(exc)[:2000]})
            continue
        write_frame(replies, {"ok": True, "value": value}, arrays)


def main() -> int:
    _limit_private_memory(int(os.environ.get("CONVGATE_LLAMA_CHILD_MEMORY", "0")))
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return serve(sys.stdin.buffer, replies)


if __name__ == "__main__":
    sys.exit(main())
