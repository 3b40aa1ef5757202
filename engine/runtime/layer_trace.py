"""llama.cpp's per-layer hidden states for one token sequence, through its eval callback.

Why: when gate 2's final embeddings or logits disagree with the reference, the layer where the two
first part says which block (and so which tensors) to look at. llama.cpp's scheduler calls
`cb_eval(tensor, ask=True)` for every graph node before computing it; answering True only for the
layer outputs makes it stop there and call back with the computed values (`ask=False`), as the
eval-callback example does, without copying every intermediate.

Which node is "layer il's output" depends on the graph builder (src/models/<arch>.cpp): most name it
`l_out-<il>`; BERT and ModernBERT leave it unnamed, so it is found by its inputs (BERT: the bias add
after the layer-output norm, i.e. the later of the two ADD nodes fed by `norm_w-<il>`; ModernBERT: the
residual ADD fed by `ffn_inp-<il>`). The batch asks for every position's output, so the last layer
keeps all rows (llama.cpp otherwise drops the rows nobody reads before the last block).
"""

from __future__ import annotations

import ctypes
import functools
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from engine.errors import ConvgateError
from engine.quant.libggml import _lib
from engine.resources import cpu_budget

GGML_TYPE_F32 = 0
# Graph node names are matched as bytes (ggml names are ASCII; nothing to decode).
_L_OUT = re.compile(rb"l_out-(\d+)")
_NORM_W = re.compile(rb"norm_w-(\d+)")
_FFN_INP = re.compile(rb"ffn_inp-(\d+)")


class TraceError(ConvgateError):
    """llama.cpp could not be traced layer by layer (no context, decode failed, layer outputs missing)."""

    code = "engine.trace_failed"


class _Tensor(ctypes.Structure):
    """struct ggml_tensor (ggml.h), read-only: the fields a layer output is recognised and copied by."""

    _fields_ = (
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * 16),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * 10),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * 64),
    )


@functools.cache
def _ggml() -> ctypes.CDLL:
    lib = _lib()
    lib.ggml_nelements.restype = ctypes.c_int64
    lib.ggml_nelements.argtypes = (ctypes.c_void_p,)
    lib.ggml_op_name.restype = ctypes.c_char_p
    lib.ggml_op_name.argtypes = (ctypes.c_int,)
    lib.ggml_backend_tensor_get.restype = None
    lib.ggml_backend_tensor_get.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t)
    return lib


def _view(pointer: int) -> _Tensor:
    return _Tensor.from_address(pointer)


def _add_fed_by(tensor: _Tensor, pattern: re.Pattern[bytes]) -> int | None:
    """The layer number in the name of an ADD node's input matching `pattern`, if any."""
    if _ggml().ggml_op_name(tensor.op) != b"ADD":
        return None
    matches = (pattern.fullmatch(_view(src).name) for src in tensor.src if src)
    return next((int(match.group(1)) for match in matches if match), None)


# A layer matcher: a graph node -> the layer whose output it is, or None.
Matcher = Callable[[_Tensor], int | None]


def _named_l_out(tensor: _Tensor) -> int | None:
    match = _L_OUT.fullmatch(tensor.name)
    return int(match.group(1)) if match else None


def _after_norm_w(tensor: _Tensor) -> int | None:
    # Two ADDs per layer are fed by norm_w-<il> (attention-output norm, then layer-output norm): the later
    # one overwrites the earlier in the capture, so the layer's output is what remains.
    return _add_fed_by(tensor, _NORM_W)


def _after_ffn_inp(tensor: _Tensor) -> int | None:
    return _add_fed_by(tensor, _FFN_INP)


MATCHERS: dict[str, Matcher] = {"bert": _after_norm_w, "modern-bert": _after_ffn_inp}


def layer_matcher(architecture: str) -> Matcher:
    """How layer outputs are recognised in `architecture`'s graph (named `l_out-<il>` unless listed)."""
    return MATCHERS.get(architecture, _named_l_out)


class _Capture:
    """The eval callback's state: which nodes to ask for and the layer outputs copied so far."""

    def __init__(self, matcher: Matcher) -> None:
        self.matcher = matcher
        self.layers: dict[int, np.ndarray] = {}
        self.error: str | None = None

    def __call__(self, pointer: int, ask: bool, _user_data: Any) -> bool:
        try:
            tensor = _view(pointer)
            layer = self.matcher(tensor)
            if ask:
                return layer is not None
            if layer is not None:
                self.layers[layer] = self._copy(pointer, tensor)
        except Exception as exc:  # an exception must not unwind through C: remember it, stop the graph
            self.error = f"{type(exc).__name__}: {exc}"
            return False
        return True

    @staticmethod
    def _copy(pointer: int, tensor: _Tensor) -> np.ndarray:
        rows, width = int(tensor.ne[1]), int(tensor.ne[0])
        contiguous = tensor.nb[0] == 4 and tensor.nb[1] == 4 * width
        if tensor.type != GGML_TYPE_F32 or not contiguous or _ggml().ggml_nelements(pointer) != rows * width:
            raise TraceError(f"{tensor.name.decode()!r} is not a contiguous F32 [{width} x {rows}] matrix")
        out = np.empty((rows, width), dtype=np.float32)
        _ggml().ggml_backend_tensor_get(pointer, out.ctypes.data, 0, out.nbytes)
        return out


def _batch(llama_cpp: Any, ids: list[int]) -> Any:
    """One sequence, every position an output (so no rows are dropped before the last layer)."""
    batch = llama_cpp.llama_batch_init(len(ids), 0, 1)
    batch.n_tokens = len(ids)
    for position, token in enumerate(ids):
        batch.token[position] = token
        batch.pos[position] = position
        batch.n_seq_id[position] = 1
        batch.seq_id[position][0] = 0
        batch.logits[position] = 1
    return batch


def _context_params(llama_cpp: Any, callback: Any, n_tokens: int) -> Any:
    """Embeddings mode for every kind of model: only the blocks' outputs are read, never a head's."""
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = params.n_batch = params.n_ubatch = n_tokens
    params.embeddings = True
    params.n_threads = params.n_threads_batch = cpu_budget()
    params.cb_eval = callback
    params.cb_eval_user_data = None
    return params


def trace_layers(model: Any, architecture: str, ids: list[int]) -> np.ndarray:
    """Every layer's output for `ids`, shape [n_layer, n_tokens, n_embd], from a fresh context of the
    already-loaded llama.cpp `model` (a `llama_model` pointer, e.g. `Llama.model`)."""
    import llama_cpp

    n_layer = int(llama_cpp.llama_model_n_layer(model))
    capture = _Capture(layer_matcher(architecture))
    callback = llama_cpp.ggml_backend_sched_eval_callback(capture)  # kept alive until the context is freed
    ctx = llama_cpp.llama_init_from_model(model, _context_params(llama_cpp, callback, len(ids)))
    if not ctx:
        raise TraceError("llama.cpp could not create a tracing context")
    batch = _batch(llama_cpp, ids)
    try:
        status = llama_cpp.llama_decode(ctx, batch)
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
    if capture.error is not None:
        raise TraceError(f"tracing stopped: {capture.error}")
    if status != 0:
        raise TraceError(f"llama_decode returned {status} while tracing")
    missing = [il for il in range(n_layer) if il not in capture.layers]
    if missing:
        raise TraceError(f"no output captured for layers {missing} of the {architecture!r} graph")
    return np.stack([capture.layers[il] for il in range(n_layer)])
