"""Importance-matrix fixtures: tiny-llama quantized the way `llama-quantize --imatrix` does it.

An importance matrix is computed here from the Hugging Face model (sum of squared inputs per column of
every block matrix over a text set, the token count as its count, as `llama-imatrix` collects them) for
two different text sets, and written in both of llama.cpp's formats (GGUF `*.in_sum2`/`*.counts` and the
legacy `.dat`). The quantized files are made by `llama_model_quantize` itself (libllama: llama.cpp's own
per-tensor type choice and its per-expert `ggml_quantize_chunk` calls) with the weights `llama-quantize`
derives from the GGUF form (`sums / counts`) and the kv overrides it adds. The chunk count is a power of
two, so the legacy form's `(sum / count * ncall) / ncall` is bit-identical to it: both files are the
imatrix of every quantized file. Nothing here imports the verifier's reader.
"""

from __future__ import annotations

import ctypes
import os
import struct
from pathlib import Path

import numpy as np
from fixture_tools import log, produce, quiet_native_stderr
from fixtures_tiny_llama import build_tiny_llama

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
CHUNK_TOKENS = 16  # llama-imatrix ignores batches of fewer than 16 tokens
# llama_ftype values from llama.h
IMATRIX_FTYPES = {"Q4_K_M": 15, "IQ4_XS": 30, "IQ2_XXS": 19}
LLAMA_KV_OVERRIDE_TYPE_INT, LLAMA_KV_OVERRIDE_TYPE_STR = 0, 3


def numbers_text() -> str:
    """The "wrong" text set: code and numbers, nothing like english.txt (deterministic)."""
    rng = np.random.default_rng(11)
    lines = []
    for i in range(24):
        a, b, c = (int(v) for v in rng.integers(0, 100000, size=3))
        lines.append(f"def f_{i}(x): return x * {a} + {b} - 0x{c:05x}  # {a / (b + 1):.6f}")
    return "\n".join(lines) + "\n"


def text_sets() -> dict[str, str]:
    return {"english": (EXAMPLES / "english.txt").read_text(encoding="utf-8"), "numbers": numbers_text()}


def collect(source: Path, text: str) -> tuple[dict[str, np.ndarray], int]:
    """Per GGUF tensor name: float32 sums of squared inputs per column; and the tokens counted."""
    import gguf
    import torch
    from tokenizers import Tokenizer
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(str(source), torch_dtype=torch.float32).eval()
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, model.config.num_hidden_layers)
    ids = Tokenizer.from_file(str(source / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    n_chunks = 1 << max(0, (len(ids) // CHUNK_TOKENS).bit_length() - 1)  # a power of two (see module doc)
    sums: dict[str, np.ndarray] = {}
    hooks = []
    for module_name, module in model.model.layers.named_modules(prefix="model.layers"):
        if isinstance(module, torch.nn.Linear):
            gguf_name = names.get_name(module_name) + ".weight"

            def hook(_module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], _out: object,
                     name: str = gguf_name) -> None:
                x = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).to(torch.float32)
                acc = sums.setdefault(name, np.zeros(x.shape[1], dtype=np.float32))
                acc += (x * x).sum(dim=0).numpy()

            hooks.append(module.register_forward_hook(hook))
    with torch.no_grad():
        for chunk in range(n_chunks):
            tokens = ids[chunk * CHUNK_TOKENS : (chunk + 1) * CHUNK_TOKENS]
            tokens[0] = model.config.bos_token_id  # llama-imatrix starts every chunk with BOS
            model(torch.tensor([tokens]))
    for handle in hooks:
        handle.remove()
    return sums, n_chunks * CHUNK_TOKENS


def write_gguf_matrices(path: Path, sums: dict[str, np.ndarray], counts: dict[str, np.ndarray], dataset: str,
                        chunks: int) -> None:
    """llama-imatrix's GGUF form: general.type, imatrix.* keys, sorted `<name>.in_sum2` [ne0, n_mat] and
    `<name>.counts` [1, n_mat] (one row and one count per matrix: one for a dense tensor, one per expert)."""
    import gguf

    writer = gguf.GGUFWriter(path, arch="imatrix")
    writer.kv_data[0].pop("general.architecture")  # llama-imatrix writes no architecture
    writer.add_type("imatrix")
    writer.add_array("imatrix.datasets", [dataset])
    writer.add_uint32("imatrix.chunk_count", chunks)
    writer.add_uint32("imatrix.chunk_size", CHUNK_TOKENS)
    for name in sorted(sums):
        writer.add_tensor(f"{name}.in_sum2", sums[name])
        writer.add_tensor(f"{name}.counts", counts[name].astype(np.float32).reshape(-1, 1))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_gguf(path: Path, sums: dict[str, np.ndarray], count: int, dataset: str, chunks: int) -> None:
    """The dense form: every tensor one matrix, every matrix seen by all `count` tokens."""
    write_gguf_matrices(path, {name: value.reshape(1, -1) for name, value in sums.items()},
                        {name: np.array([count]) for name in sums}, dataset, chunks)


def write_dat(path: Path, sums: dict[str, np.ndarray], count: int, dataset: str, chunks: int) -> None:
    """llama-imatrix's legacy form: per entry `(sum / count) * ncall`, then the chunk count and dataset."""
    out = bytearray(struct.pack("<i", len(sums)))
    ncall = -(-count // CHUNK_TOKENS)
    for name in sorted(sums):
        values = (sums[name] / np.float32(count)) * np.float32(ncall)
        out += struct.pack("<i", len(name)) + name.encode() + struct.pack("<ii", ncall, values.size)
        out += values.astype("<f4").tobytes()
    out += struct.pack("<i", chunks) + struct.pack("<i", len(dataset)) + dataset.encode()
    path.write_bytes(bytes(out))


def _override(key: str, value: int | str) -> object:
    import llama_cpp

    item = llama_cpp.llama_model_kv_override()
    item.key = key.encode()
    if isinstance(value, int):
        item.tag, item.value.val_i64 = LLAMA_KV_OVERRIDE_TYPE_INT, value
    else:
        item.tag, item.value.val_str = LLAMA_KV_OVERRIDE_TYPE_STR, value.encode()[:127]
    return item


def quantize_with(base: Path, ftype: int, weights: dict[str, np.ndarray], imatrix_name: str, dataset: str,
                  chunks: int, out: Path) -> None:
    """llama-quantize --imatrix: its entries as `params.imatrix`, its four `quantize.imatrix.*` overrides."""
    import llama_cpp
    keep = {name: np.ascontiguousarray(w, dtype=np.float32) for name, w in weights.items()}
    data = (llama_cpp.llama_model_imatrix_data * (len(keep) + 1))()
    for i, (name, w) in enumerate(keep.items()):
        data[i].name, data[i].size = name.encode(), w.size
        data[i].data = w.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
    overrides = (llama_cpp.llama_model_kv_override * 5)(
        _override("quantize.imatrix.file", imatrix_name), _override("quantize.imatrix.dataset", dataset),
        _override("quantize.imatrix.entries_count", len(keep)), _override("quantize.imatrix.chunks_count", chunks))
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.nthread = ftype, os.cpu_count() or 1
    params.imatrix = ctypes.cast(data, type(params.imatrix))
    params.kv_overrides = ctypes.cast(overrides, type(params.kv_overrides))
    with quiet_native_stderr():
        status = llama_cpp.llama_model_quantize(str(base).encode(), str(out).encode(), ctypes.byref(params))
    if status != 0:
        raise RuntimeError(f"llama_model_quantize with an imatrix failed for ftype {ftype}")


def _same_weights_from_both_forms(sums: dict[str, np.ndarray], count: int) -> dict[str, np.ndarray]:
    """What llama-quantize derives from the GGUF form (sum / count) equals what it derives from the .dat form
    ((sum / count * ncall) / ncall) bit for bit, so one quantized file serves both."""
    ncall = np.float32(-(-count // CHUNK_TOKENS))
    weights = {name: s / np.float32(count) for name, s in sums.items()}
    for name, s in sums.items():
        legacy = ((s / np.float32(count)) * ncall) / ncall
        if not np.array_equal(legacy.view(np.uint32), weights[name].view(np.uint32)):
            raise RuntimeError(f"the two imatrix forms give different weights for {name}")
    return weights


def build_imatrix(cache: Path) -> None:
    """imatrix-{english,numbers}.{gguf,dat}, then tiny-llama-<ftype>-imat.gguf quantized with the english one
    (the last file written is the IQ2_XXS one)."""
    build_tiny_llama(cache)
    llama = cache / "tiny-llama"
    out = cache / "imatrix"
    out.mkdir(exist_ok=True)
    targets = [out / f"imatrix-{name}.{suffix}" for name in text_sets() for suffix in ("gguf", "dat")]
    targets += [out / f"tiny-llama-{qtype}-imat.gguf" for qtype in IMATRIX_FTYPES]
    if all(target.exists() for target in targets):
        return
    english: tuple[dict[str, np.ndarray], int] | None = None
    for set_name, text in text_sets().items():
        dataset = f"texts-{set_name}.txt"
        produce(out / dataset, lambda tmp, text=text: tmp.write_text(text, encoding="utf-8"))
        log(f"collecting the {set_name} importance matrix")
        sums, count = collect(llama / "source", text)
        english = (sums, count) if set_name == "english" else english
        for suffix, write in (("gguf", write_gguf), ("dat", write_dat)):
            produce(out / f"imatrix-{set_name}.{suffix}",
                    lambda tmp, write=write, sums=sums, count=count, dataset=dataset:
                    write(tmp, sums, count, dataset, count // CHUNK_TOKENS))
    assert english is not None
    weights = _same_weights_from_both_forms(*english)
    for qtype, ftype in IMATRIX_FTYPES.items():
        produce(out / f"tiny-llama-{qtype}-imat.gguf", lambda tmp, ftype=ftype: quantize_with(
            llama / "tiny-llama-F32.gguf", ftype, weights, "imatrix-english.gguf", "texts-english.txt",
            english[1] // CHUNK_TOKENS, tmp))
