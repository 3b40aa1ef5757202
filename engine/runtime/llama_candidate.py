"""The candidate: the GGUF as an outside user runs it, through llama-cpp-python, in this process.

Only the llama.cpp child (`llama_child.py`) builds one: the gates talk to it through `LlamaProcess`
(`llama_process.py`), so an abort or a segfault inside llama.cpp ends the child, not the verifier.
`Llama.tokenize(text, add_bos=...)` passes that flag to llama.cpp as `add_special`, so
`add_bos=False` also drops an automatic EOS; `special` is `parse_special`. Load failures are
translated to `CandidateLoadError` here.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import ConvgateError, ReferenceMissingError
from engine.resources import cpu_budget


class CandidateLoadError(ConvgateError):
    """llama.cpp could not load the GGUF."""

    code = "engine.candidate_load_failed"


LLAMA_POOLING_RANK = 4  # enum llama_pooling_type: a classification head's score per sequence


@contextmanager
def _weights_from_the_map() -> Iterator[None]:
    """llama.cpp's CPU backend copies Q4_0/Q4_K/IQ4_NL weights into repacked anonymous buffers unless
    `use_extra_bufts` is off: a second copy of most of a 4-bit model that a pod cannot reclaim (+650 MiB
    at 1.7B Q4_K_M; ~35 GiB for a 70B). Off, every weight is read from the GGUF's map, so gate 2 stays
    within its bound. llama-cpp-python's `Llama()` takes no argument for it, so the params factory it
    calls is wrapped while the model loads, and restored."""
    import llama_cpp.llama as wrapper

    library = wrapper.llama_cpp
    default = library.llama_model_default_params

    def params() -> Any:
        chosen = default()
        chosen.use_extra_bufts = False
        return chosen

    library.llama_model_default_params = params
    try:
        yield
    finally:
        library.llama_model_default_params = default


# A causal LM is decoded in batches of at most this many positions (its KV cache carries the context between
# them), so llama.cpp's output and compute buffers hold a batch's rows of vocabulary logits, never context x
# vocabulary; a large vocabulary gets smaller batches (DECODE_BATCH_BYTES of float32 logits, at least
# MIN_DECODE_BATCH positions). 256 is also the longest text the thresholds were measured on: those texts
# are decoded in one batch, as they were then.
DECODE_BATCH = 256
MIN_DECODE_BATCH = 32
DECODE_BATCH_BYTES = 64 << 20


def decode_batch(vocabulary: int | None, n_ctx: int) -> int:
    """How many positions a causal LM is decoded at a time. Batches start at multiples of it from a text's
    first token, whatever positions are asked for: llama.cpp's numbers depend on how a text is batched (a
    K-quant's logits moved by 1% between one batch of 120 tokens and three of 40), so gate 2 and gate 3 must
    batch every text alike."""
    fitting = DECODE_BATCH if not vocabulary else DECODE_BATCH_BYTES // (4 * vocabulary)
    return max(1, min(n_ctx, DECODE_BATCH, max(MIN_DECODE_BATCH, fitting)))


class LlamaCandidate:
    def __init__(self, path: Path, *, embedding: bool, n_ctx: int, rank: bool = False,
                 batch: int | None = None) -> None:
        try:
            from llama_cpp import Llama
        except ImportError as exc:
            raise ReferenceMissingError("llama-cpp-python is not installed") from exc
        pooling: dict[str, Any] = {"pooling_type": LLAMA_POOLING_RANK} if rank else {}
        threads = cpu_budget()  # llama-cpp-python's default is the host's CPU count, not the pod's limit
        pooled = embedding or rank  # a pooled sequence must fit one batch; a causal LM is decoded in batches
        self.n_batch = n_ctx if pooled else min(n_ctx, batch or DECODE_BATCH)
        try:
            with _weights_from_the_map():
                self.llm: Any = Llama(
                    str(path), embedding=pooled, logits_all=False, n_ctx=n_ctx, n_batch=self.n_batch,
                    n_ubatch=self.n_batch, verbose=False, n_threads=threads, n_threads_batch=threads, **pooling,
                )
        except (ValueError, RuntimeError) as exc:
            raise CandidateLoadError(f"llama.cpp cannot load {path.name}: {exc}") from exc
        self._decoded: list[int] = []  # the ids whose keys and values the context holds, in order

    def close(self) -> None:
        self.llm.close()

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        return list(self.llm.tokenize(text.encode("utf-8"), add_bos=add_special, special=parse_special))

    def embed(self, text: str) -> np.ndarray:
        """Pooled, unnormalised embedding, tokenized by llama.cpp itself (add_special, no parsing)."""
        return np.asarray(self.llm.embed(text, normalize=False, truncate=False), dtype=np.float64)

    def logits(self, ids: list[int]) -> np.ndarray:
        """Every position's logits, [len(ids), n_vocab] (tests and short texts; gate 2 asks by rows)."""
        return self.logits_rows(ids, 0, len(ids)).astype(np.float64)

    def logits_rows(self, ids: list[int], start: int, stop: int) -> np.ndarray:
        """The logits of positions [start, stop) of `ids`, float32 [stop - start, n_vocab]. The text is decoded
        in batches of `n_batch` positions from its first token (see `decode_batch`), only the asked positions
        output logits, and a call that continues the ids of the previous one from a batch boundary reuses the
        keys and values already computed (a long text asked for batch by batch is decoded once)."""
        if not 0 <= start < stop <= len(ids):
            raise ValueError(f"positions [{start}, {stop}) are not within a text of {len(ids)} tokens")
        done = len(self._decoded)
        if self._decoded != ids[:done] or start < done:
            self._forget()
        n_vocab = int(self.llm.n_vocab())
        out = np.empty((stop - start, n_vocab), dtype=np.float32)
        filled = 0
        while len(self._decoded) < stop:
            first = len(self._decoded)
            end = min(len(ids), (first // self.n_batch + 1) * self.n_batch)
            outputs = self._decode(ids[first:end], first, wanted=range(start, stop))
            if outputs:
                out[filled:filled + outputs] = self._last_logits(outputs, n_vocab)
                filled += outputs
        return out

    def top1(self, ids: list[int]) -> tuple[np.ndarray, bool]:
        """Each position's most likely next token and whether every logit was finite (gate 3's re-measure),
        one batch of logits held at a time."""
        self._forget()
        n_vocab = int(self.llm.n_vocab())
        found, finite = [], True
        while len(self._decoded) < len(ids):
            first = len(self._decoded)
            chunk = ids[first:first + self.n_batch]
            logits = self._last_logits(self._decode(chunk, first, wanted=range(len(ids))), n_vocab)
            found.append(logits.argmax(axis=-1))
            finite = finite and bool(np.all(np.isfinite(logits)))
        return (np.concatenate(found) if found else np.zeros(0)).astype(np.int64), finite

    def _forget(self) -> None:
        self.llm._ctx.kv_cache_clear()
        self._decoded = []

    def _decode(self, chunk: list[int], first: int, *, wanted: range) -> int:
        """Decode `chunk` at positions first.. (continuing the context); the positions in `wanted` output
        logits. Returns how many did."""
        batch = self.llm._batch.batch
        outputs = 0
        for i, token in enumerate(chunk):
            batch.token[i] = token
            batch.pos[i] = first + i
            batch.seq_id[i][0] = 0
            batch.n_seq_id[i] = 1
            batch.logits[i] = first + i in wanted
            outputs += first + i in wanted
        batch.n_tokens = len(chunk)
        self.llm._ctx.decode(self.llm._batch)
        self._decoded.extend(chunk)
        return outputs

    def _last_logits(self, outputs: int, n_vocab: int) -> np.ndarray:
        """The rows the last decode output, copied out of llama.cpp's buffer."""
        import llama_cpp

        pointer = llama_cpp.llama_get_logits(self.llm._ctx.ctx)
        return np.ctypeslib.as_array(pointer, shape=(outputs, n_vocab)).copy()

    def pair_tokens(self, query: str, document: str) -> list[int]:
        """A (query, document) pair as llama-server's /rerank builds it without a rerank template:
        [BOS] query [EOS] [SEP] document [EOS], each special token only where the GGUF's flags add it."""
        import llama_cpp

        vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        eos = llama_cpp.llama_vocab_eos(vocab)
        eos = eos if eos != -1 else llama_cpp.llama_vocab_sep(vocab)
        add_eos = llama_cpp.llama_vocab_get_add_eos(vocab)
        out = [llama_cpp.llama_vocab_bos(vocab)] if llama_cpp.llama_vocab_get_add_bos(vocab) else []
        out += self.tokenize(query, add_special=False, parse_special=False) + ([eos] if add_eos else [])
        out += [llama_cpp.llama_vocab_sep(vocab)] if llama_cpp.llama_vocab_get_add_sep(vocab) else []
        return out + self.tokenize(document, add_special=False, parse_special=False) + ([eos] if add_eos else [])

    def rank_scores(self, tokens: list[int]) -> np.ndarray:
        """The classification head's outputs for one sequence (pooling RANK): n_cls_out floats."""
        import llama_cpp

        self.llm._batch.reset()
        self.llm._ctx.kv_cache_clear()
        self.llm._batch.add_sequence(tokens, 0, True)
        self.llm._ctx.decode(self.llm._batch)
        pointer = llama_cpp.llama_get_embeddings_seq(self.llm._ctx.ctx, 0)
        n_out = int(llama_cpp.llama_model_n_cls_out(self.llm.model))
        scores = np.array([pointer[i] for i in range(n_out)], dtype=np.float64)
        self.llm._batch.reset()
        self.llm._ctx.kv_cache_clear()
        return scores

    @property
    def n_embd(self) -> int:
        return int(self.llm.n_embd())

    def vocab_facts(self) -> dict[str, Any]:
        import llama_cpp

        vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        return {"bos": int(llama_cpp.llama_vocab_bos(vocab)), "eos": int(llama_cpp.llama_vocab_eos(vocab)),
                "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab))}

    def render_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool,
                    source_dir: str) -> dict[str, Any]:
        """One conversation's token ids as three runtimes make them (see engine/gates/runtime/chat_template.py):
        llama.cpp's built-in template path, llama-cpp-python's Jinja formatter on the GGUF's template, and
        transformers' `apply_chat_template` on the source's; each as ids or the error it raised. Here, in the
        child, because a hostile template is hostile input too (the Jinja renderers are sandboxed; a
        template that loops or grows without end meets the child's deadline and memory cap)."""
        import ctypes

        import llama_cpp

        template = llama_cpp.llama_model_chat_template(self.llm.model, None)
        chat = (llama_cpp.llama_chat_message * len(messages))(*[
            llama_cpp.llama_chat_message(role=m["role"].encode(), content=m["content"].encode()) for m in messages])
        out: dict[str, Any] = {"gguf_has_template": template is not None}
        size = llama_cpp.llama_chat_apply_template(template, chat, len(messages), add_generation_prompt, None, 0)
        if size < 0:
            out["builtin"] = {"error": "llama.cpp has no built-in template that recognises the GGUF's"}
        else:
            buffer = ctypes.create_string_buffer(size + 1)
            llama_cpp.llama_chat_apply_template(template, chat, len(messages), add_generation_prompt, buffer, size + 1)
            prompt = buffer.raw[:size].decode("utf-8", errors="replace")
            out["builtin"] = {"ids": self.tokenize(prompt, add_special=True, parse_special=True)}
        out["jinja"], out["jinja_server"] = self._jinja(template, messages, add_generation_prompt)
        out["hf"] = _hf_chat(source_dir, messages, add_generation_prompt)
        return out

    def _jinja(self, template: bytes | None, messages: list[dict[str, str]],
               add_generation_prompt: bool) -> tuple[dict[str, Any], dict[str, Any]]:
        """The GGUF's own template rendered by llama-cpp-python's chat formatter, tokenized as its chat completion
        does (the template is trusted to write its own BOS: no automatic one) and as llama-server with --jinja
        does (the GGUF's automatic BOS as well)."""
        if template is None:
            missing = {"error": "the GGUF has no chat template"}
            return missing, missing
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        vocab = self.llm._model
        bos, eos = vocab.token_get_text(self.llm.token_bos()), vocab.token_get_text(self.llm.token_eos())
        try:
            formatter = Jinja2ChatFormatter(template.decode("utf-8", errors="replace"), eos_token=eos, bos_token=bos,
                                            add_generation_prompt=add_generation_prompt)
            prompt = formatter(messages=messages).prompt  # type: ignore[arg-type]
        except Exception as exc:  # a template error is an answer here, not a crash of the child
            failed = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            return failed, failed
        return ({"ids": self.tokenize(prompt, add_special=False, parse_special=True)},
                {"ids": self.tokenize(_as_server_sends(prompt, bos if vocab.add_bos_token() else None,
                                                       eos if vocab.add_eos_token() else None),
                                      add_special=True, parse_special=True)})

    def trace_layers(self, architecture: str, ids: list[int]) -> np.ndarray:
        """Every layer's output for `ids`, [n_layer, n_tokens, n_embd] (see layer_trace.py)."""
        from engine.runtime.layer_trace import trace_layers

        return trace_layers(self.llm.model, architecture, ids)


def _as_server_sends(prompt: str, bos: str | None, eos: str | None) -> str:
    """What llama-server --jinja tokenizes (common/chat.cpp): a rendered prompt loses the BOS it starts with when
    the vocabulary adds one itself, and the EOS it ends with when the vocabulary appends one."""
    if bos and prompt.startswith(bos):
        prompt = prompt[len(bos):]
    if eos and prompt.endswith(eos):
        prompt = prompt[:-len(eos)]
    return prompt


@functools.cache
def _hf_tokenizer(source_dir: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(source_dir)


def _hf_chat(source_dir: str, messages: list[dict[str, str]], add_generation_prompt: bool) -> dict[str, Any]:
    """transformers' `apply_chat_template` with the source's tokenizer, its ids as transformers tokenizes them."""
    try:
        ids = _hf_tokenizer(source_dir).apply_chat_template(messages, tokenize=True,
                                                            add_generation_prompt=add_generation_prompt)
    except Exception as exc:  # the template may refuse a conversation (a role it does not support)
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    found = ids["input_ids"] if hasattr(ids, "keys") else ids  # transformers 5 may answer with an encoding
    return {"ids": [int(i) for i in found]}
