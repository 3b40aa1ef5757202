"""The candidate as the gates see it: llama.cpp in a child process, called like a local object.

Why: llama.cpp is native code fed a hostile file. Run in the verifier's own process, an `abort()` on an
unexpected metadata value (a `block_count` far larger than the tensors, for one) ended the whole
`convgate verify` with no report, and in the service it burned every attempt without a verdict. In a
child (`llama_child.py`) the same abort ends the child; the call that was waiting raises
`LlamaCrashedError` naming the signal, and the gate records it as `runtime.crashed`, a NO-GO like any
other. A call that outlives its deadline kills the child and is reported the same way (a hang is as
fatal to a verification as a crash).

Each `LlamaProcess` is one child holding one loaded model; `close()` (or the context manager) ends it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from engine.errors import ConvgateError, ReferenceMissingError
from engine.resources import llama_memory_limit
from engine.runtime.llama_candidate import CandidateLoadError, decode_batch
from engine.runtime.wire import WireError, read_frame, write_frame

# A load and any single call must finish within this; a 70B model's map and a 2048-token trace fit.
CALL_TIMEOUT_S = 1800.0
STDERR_TAIL_BYTES = 4096


class LlamaCrashedError(ConvgateError):
    """The llama.cpp child died (a signal, an exit or the deadline) while loading or answering a call."""

    code = "engine.llama_crashed"

    def __init__(self, during: str, cause: str, stderr_tail: str) -> None:
        self.during = during
        self.cause = cause
        self.stderr_tail = stderr_tail
        last = stderr_tail.strip().splitlines()[-1:] if stderr_tail.strip() else []
        said = f"; its last words: {last[0][:200]!r}" if last else ""
        super().__init__(f"llama.cpp {cause} while {during}{said}")


class LlamaCallError(ConvgateError):
    """A call failed inside the child with a Python exception (the child is still alive)."""

    code = "engine.llama_call_failed"


def describe_exit(returncode: int | None, timed_out: bool) -> str:
    """How the child ended, as a blocker names it: the signal's name where there is one."""
    if timed_out:
        return f"did not answer within {CALL_TIMEOUT_S:g} s and was killed"
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"died with {name}"
    return f"exited with status {returncode}"


def _printable(raw: bytes) -> str:
    """The child's last stderr bytes as one can log them: the file's own strings may be in them."""
    text = raw.decode("utf-8", errors="replace")
    return "".join(ch if ch.isprintable() or ch == "\n" else "?" for ch in text)


@dataclass
class Pending:
    """A call written to the child whose answer has not been read: what it was doing, and its deadline."""

    during: str
    timed_out: threading.Event
    watchdog: threading.Timer


class LlamaProcess:
    """One llama.cpp child with `path` loaded; methods mirror `LlamaCandidate`'s."""

    def __init__(self, path: Path, *, embedding: bool, n_ctx: int, rank: bool = False,
                 memory_limit: int | None = None, vocabulary: int | None = None) -> None:
        """`vocabulary`: the GGUF's token count, which sizes a causal LM's decode batches (`decode_batch`)."""
        limit = llama_memory_limit() if memory_limit is None else memory_limit
        env = dict(os.environ, CONVGATE_LLAMA_CHILD_MEMORY=str(limit or 0))
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - open for the child's life, closed by _release
        self._process = subprocess.Popen(
            [sys.executable, "-m", "engine.runtime.llama_child"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._stderr, env=env)
        self._closed = False
        self._pending: Pending | None = None
        self.decode_batch = decode_batch(vocabulary, n_ctx)  # positions per batch; batches start at its multiples
        self._call("loading the model", {"path": str(path), "embedding": embedding, "n_ctx": n_ctx, "rank": rank,
                                         "batch": self.decode_batch}, opening=True)

    # --- the calls the gates make -------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        value, _ = self._call("tokenizing", {"call": "tokenize", "args": {
            "text": text, "add_special": add_special, "parse_special": parse_special}})
        return [int(i) for i in value]

    def embed(self, text: str) -> np.ndarray:
        _, (vector,) = self._call("embedding a text", {"call": "embed", "args": {"text": text}})
        return vector.astype(np.float64)

    def logits(self, ids: list[int]) -> np.ndarray:
        _, (logits,) = self._call("computing logits", {"call": "logits", "args": {"ids": [int(i) for i in ids]}})
        return logits.astype(np.float64)

    def logits_rows(self, segments: list[tuple[list[int], int, int]]) -> np.ndarray:
        """Rows [start, stop) of each (ids, start, stop) segment's logits, concatenated: float32
        [sum of stop - start, n_vocab]."""
        return self.collect(self.submit_logits_rows(segments))

    def submit_logits_rows(self, segments: list[tuple[list[int], int, int]]) -> Pending:
        """Ask for `logits_rows` and return at once: the child computes while the caller does other work
        (the reference's side of the same block), then `collect` takes the answer."""
        request = {"call": "logits_rows", "args": {"segments": [[[int(i) for i in ids], int(start), int(stop)]
                                                                for ids, start, stop in segments]}}
        return self._send("computing logits", request)

    def collect(self, pending: Pending) -> np.ndarray:
        _, (rows,) = self._receive(pending)
        return rows

    def top1(self, ids: list[int]) -> tuple[np.ndarray, bool]:
        """Each position's most likely next token, and whether every logit was finite: computed in the child,
        so no logits cross the pipe."""
        finite, (top,) = self._call("computing top tokens", {"call": "top1", "args": {"ids": [int(i) for i in ids]}})
        return top, bool(finite)

    def pair_tokens(self, query: str, document: str) -> list[int]:
        value, _ = self._call("building a pair", {"call": "pair_tokens", "args": {"query": query,
                                                                               "document": document}})
        return [int(i) for i in value]

    def rank_scores(self, tokens: list[int]) -> np.ndarray:
        _, (scores,) = self._call("scoring a pair", {"call": "rank_scores", "args": {"tokens": [int(i) for i in
                                                                                           tokens]}})
        return scores.astype(np.float64)

    @property
    def n_vocab(self) -> int:
        value, _ = self._call("reading n_vocab", {"call": "n_vocab"})
        return int(value)

    @property
    def n_embd(self) -> int:
        value, _ = self._call("reading n_embd", {"call": "n_embd"})
        return int(value)

    def trace_layers(self, architecture: str, ids: list[int]) -> np.ndarray:
        _, (layers,) = self._call("tracing layers", {"call": "trace_layers", "args": {
            "architecture": architecture, "ids": [int(i) for i in ids]}})
        return layers

    def render_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool,
                    source_dir: Path) -> dict[str, Any]:
        value, _ = self._call("rendering a chat template", {"call": "render_chat", "args": {
            "messages": messages, "add_generation_prompt": add_generation_prompt, "source_dir": str(source_dir)}})
        return dict(value)

    def vocab_facts(self) -> dict[str, Any]:
        """BOS/EOS ids and whether llama.cpp adds them (what its tokenizer does with add_special)."""
        value, _ = self._call("reading the vocabulary", {"call": "vocab"})
        return dict(value)

    # --- the child's life ----------------------------------------------------------------------------

    def _call(self, during: str, request: dict[str, Any], opening: bool = False) -> tuple[Any, list[np.ndarray]]:
        return self._receive(self._send(during, request), opening=opening)

    def _send(self, during: str, request: dict[str, Any]) -> Pending:
        """Write one call and arm its deadline; one call is in flight at a time."""
        process = self._process
        if self._closed or process.stdin is None or process.stdout is None or self._pending is not None:
            raise LlamaCrashedError(during, "is no longer running" if self._pending is None else
                                    "was asked a second question before answering the first", "")
        timed_out = threading.Event()

        def kill() -> None:
            timed_out.set()
            process.kill()

        pending = Pending(during, timed_out, threading.Timer(CALL_TIMEOUT_S, kill))
        pending.watchdog.start()
        self._pending = pending
        try:
            write_frame(process.stdin, request)
        except (BrokenPipeError, ValueError) as exc:
            pending.watchdog.cancel()
            self._pending = None
            raise self._crashed(during, timed_out.is_set(), exc) from exc
        return pending

    def _receive(self, pending: Pending, opening: bool = False) -> tuple[Any, list[np.ndarray]]:
        """The answer to the call in flight, or the error that ended the child meanwhile."""
        process = self._process
        if process.stdout is None or pending is not self._pending:
            raise LlamaCallError(f"{pending.during}: no such call is in flight")
        try:
            reply, arrays = read_frame(process.stdout)
        except (EOFError, BrokenPipeError, WireError, ValueError) as exc:
            raise self._crashed(pending.during, pending.timed_out.is_set(), exc) from exc
        finally:
            pending.watchdog.cancel()
            self._pending = None
        if reply.get("ok"):
            return reply.get("value"), arrays
        message = str(reply.get("message", ""))
        if opening and reply.get("error") in ("load", "reference_missing"):
            self.close()
            raise (CandidateLoadError if reply["error"] == "load" else ReferenceMissingError)(message)
        raise LlamaCallError(f"{pending.during}: {reply.get('error')}: {message}")

    def _crashed(self, during: str, timed_out: bool, exc: Exception) -> LlamaCrashedError:
        """The child is gone (or talking nonsense): reap it and say how it ended."""
        process = self._process
        if isinstance(exc, WireError):
            process.kill()
        try:
            returncode = process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            returncode = process.wait()
        self._stderr.seek(0, os.SEEK_END)
        size = self._stderr.tell()
        self._stderr.seek(max(0, size - STDERR_TAIL_BYTES))
        tail = _printable(self._stderr.read())
        self._release()
        cause = f"answered with a malformed frame ({exc})" if isinstance(exc, WireError) and not timed_out else (
            describe_exit(returncode, timed_out))
        return LlamaCrashedError(during, cause, tail)

    def close(self) -> None:
        if self._closed:
            return
        process = self._process
        with contextlib.suppress(BrokenPipeError, OSError, ValueError):
            if process.stdin is not None:
                write_frame(process.stdin, {"call": "close"})
                process.stdin.close()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        self._release()

    def _release(self) -> None:
        """The pipes and the stderr file of a child that has ended, and the deadline of a call left unread."""
        self._closed = True
        if self._pending is not None:
            self._pending.watchdog.cancel()
            self._pending = None
        for stream in (self._process.stdin, self._process.stdout, self._stderr):
            with contextlib.suppress(OSError, ValueError):
                if stream is not None:
                    stream.close()

    def __enter__(self) -> LlamaProcess:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
