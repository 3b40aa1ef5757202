"""A mixture-of-experts importance-matrix fixture: a tiny qwen3moe quantized the way `llama-quantize --imatrix` does.

llama-imatrix collects a stacked-expert tensor (ggml's MUL_MAT_ID) per expert: expert e's row of
`<tensor>.in_sum2` [ne0, n_expert] sums x^2 over only the tokens the router sent to e, and
`<tensor>.counts` [1, n_expert] counts them (tools/imatrix/imatrix.cpp). transformers 5 keeps a qwen3moe
layer's experts as two stacked parameters (`gate_up_proj`, `down_proj`) multiplied expert by expert with
exactly each expert's routed tokens; a forward pre-hook on that experts module sees the hidden states and
the routing, and sums the same per-expert inputs: the routed tokens for gate and up, and act(gate) * up
for down, computed with the expert's own weights as the forward does. Forward hooks on the attention's
Linear layers and on the router (a plain weight multiplied in its forward) collect the rest. The legacy `.dat` form
stores `(sum / count_e) * ncall` with one `ncall = ceil(max_e count_e / chunk_size)` per tensor, which
need not be a power of two for an expert tensor: llama-quantize can then derive slightly different
weights from the two forms, so each form gets its own quantized file (`<qtype>-imat.gguf`,
`<qtype>-imat-dat.gguf`; for this text set the weights happen to be equal). The builder refuses a
text set that leaves an expert without tokens (llama.cpp would weigh such an expert with 1s).

Every width the experts are quantized along is 256, so K-quants and IQ4_XS apply to
ffn_{gate,up,down}_exps (no fallback type). The tokenizer is GPT-2's (a 50k-token BPE the converter's
qwen3moe path accepts and reads back cleanly), rebuilt from llama.cpp's vocab file: Qwen's own
151k-token vocabulary would make the 256-wide embeddings several times larger than the rest.
Helpers of fixtures_imatrix and fixtures_decoders are imported, not copied.
"""

from __future__ import annotations

import json
import struct
from functools import partial
from pathlib import Path

import numpy as np
from fixture_tools import convert, llama_cpp_tree, log, produce
from fixtures_decoders import DecoderFixture, _make_source
from fixtures_imatrix import CHUNK_TOKENS, IMATRIX_FTYPES, quantize_with, text_sets
from fixtures_imatrix import write_gguf_matrices as write_gguf

FOLDER = "imatrix-moe"
MOE = DecoderFixture(
    FOLDER, "Qwen3MoeConfig", "Qwen3MoeForCausalLM", "gpt-2",
    {"hidden_size": 256, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
     "num_key_value_heads": 2, "head_dim": 64, "max_position_embeddings": 512, "num_experts": 4,
     "num_experts_per_tok": 2, "moe_intermediate_size": 256, "norm_topk_prob": True,
     "tie_word_embeddings": True, "rms_norm_eps": 1e-6})
QTYPES = ("Q4_K_M", "IQ4_XS", "IQ2_XXS")
LAST_FILE = f"{QTYPES[-1]}-imat-dat.gguf"
Sums = dict[str, np.ndarray]  # GGUF name -> float32 [n_mat, ne0]
Counts = dict[str, np.ndarray]  # GGUF name -> int64 [n_mat]


def collect(source: Path, text: str) -> tuple[Sums, Counts, int]:
    """Per tensor: float32 sums of squared inputs per column and matrix, the rows each matrix saw, and the
    number of tokens evaluated (a power of two of chunks of CHUNK_TOKENS; BOS first where the vocab adds one)."""
    import gguf
    import torch
    from tokenizers import Tokenizer
    from transformers import Qwen3MoeForCausalLM

    model = Qwen3MoeForCausalLM.from_pretrained(str(source), dtype=torch.float32).eval()
    n_expert = model.config.num_experts
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3MOE, model.config.num_hidden_layers)
    add_bos = json.loads((source / "tokenizer_config.json").read_text(encoding="utf-8")).get("add_bos_token", False)
    ids = Tokenizer.from_file(str(source / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    n_chunks = 1 << max(0, (len(ids) // CHUNK_TOKENS).bit_length() - 1)
    sums: Sums = {}
    counts: Counts = {}
    hooks = []

    def add(name: str, index: int, n_mat: int, x: torch.Tensor) -> None:
        x = x.detach().reshape(-1, x.shape[-1]).to(torch.float32)
        acc = sums.setdefault(name, np.zeros((n_mat, x.shape[1]), dtype=np.float32))
        seen = counts.setdefault(name, np.zeros(n_mat, dtype=np.int64))
        acc[index] += (x * x).sum(dim=0).numpy()
        seen[index] += x.shape[0]

    for module_name, module in model.model.layers.named_modules(prefix="model.layers"):
        if hasattr(module, "gate_up_proj"):  # a layer's stacked experts
            stacked = {proj: names.get_name(f"{module_name}.{proj}") + ".weight"
                       for proj in ("gate_proj", "up_proj", "down_proj")}

            def experts(experts_module: torch.nn.Module, inputs: tuple[torch.Tensor, ...],
                        stacked: dict[str, str] = stacked) -> None:
                hidden, chosen = inputs[0], inputs[1]
                for expert in range(n_expert):
                    rows = (chosen == expert).any(dim=-1).nonzero().flatten()
                    if not rows.numel():
                        continue
                    x = hidden[rows]
                    gate, up = torch.nn.functional.linear(x, experts_module.gate_up_proj[expert]).chunk(2, dim=-1)
                    for proj, seen_input in (("gate_proj", x), ("up_proj", x),
                                             ("down_proj", experts_module.act_fn(gate) * up)):
                        add(stacked[proj], expert, n_expert, seen_input)

            hooks.append(module.register_forward_pre_hook(experts))
        elif isinstance(module, torch.nn.Linear) or module_name.endswith(".mlp.gate"):  # and the router
            name = names.get_name(module_name) + ".weight"
            hooks.append(module.register_forward_hook(
                lambda _m, inputs, _out, name=name: add(name, 0, 1, inputs[0])))
    with torch.no_grad():
        for chunk in range(n_chunks):
            tokens = ids[chunk * CHUNK_TOKENS : (chunk + 1) * CHUNK_TOKENS]
            if add_bos:
                tokens[0] = model.config.bos_token_id  # llama-imatrix starts a chunk with BOS if the vocab adds one
            model(torch.tensor([tokens]))
    for handle in hooks:
        handle.remove()
    return sums, counts, n_chunks * CHUNK_TOKENS


def check_routing(counts: Counts, tokens: int, top_k: int) -> None:
    """Every token reaches top_k distinct experts, and every expert is reached (no partial entry)."""
    for name, seen in counts.items():
        if seen.size > 1 and (seen.sum() != tokens * top_k or (seen == 0).any()):
            raise RuntimeError(f"{name}: expert counts {seen.tolist()} for {tokens} tokens, top-{top_k}")


def _ncall(seen: np.ndarray) -> int:
    return int(-(-int(seen.max()) // CHUNK_TOKENS))  # save_imatrix_legacy: ceil(max count / chunk size)


def _dat_values(sums: np.ndarray, seen: np.ndarray) -> np.ndarray:
    """save_imatrix_legacy's `(value / count) * ncall` per matrix (value = count = 1 where a matrix saw nothing)."""
    count = np.where(seen > 0, seen, 1).astype(np.float32)[:, None]
    values = np.where(seen[:, None] > 0, sums, np.float32(1))
    return (values / count) * np.float32(_ncall(seen))


def write_dat(path: Path, sums: Sums, counts: Counts, dataset: str, chunks: int) -> None:
    """llama-imatrix's legacy form, matrix-major values, then the chunk count and the dataset name."""
    out = bytearray(struct.pack("<i", len(sums)))
    for name in sorted(sums):
        values = _dat_values(sums[name], counts[name]).reshape(-1)
        out += struct.pack("<i", len(name)) + name.encode() + struct.pack("<ii", _ncall(counts[name]), values.size)
        out += values.astype("<f4").tobytes()
    out += struct.pack("<i", chunks) + struct.pack("<i", len(dataset)) + dataset.encode()
    path.write_bytes(bytes(out))


def quantize_weights(sums: Sums, counts: Counts) -> dict[str, dict[str, np.ndarray]]:
    """What llama-quantize derives from each form: GGUF `sum / count` (1 for count 0), legacy `value / ncall`."""
    gguf_form, dat_form = {}, {}
    for name, s in sums.items():
        seen = counts[name]
        per_matrix = np.ones_like(s)
        per_matrix[seen > 0] = s[seen > 0] / seen[seen > 0].astype(np.float32)[:, None]
        gguf_form[name] = per_matrix.reshape(-1)
        dat_form[name] = (_dat_values(s, seen) / np.float32(_ncall(seen))).reshape(-1)
    return {"gguf": gguf_form, "dat": dat_form}


def quantized_name(qtype: str, form: str) -> str:
    """The file quantized with the weights llama-quantize derives from the english imatrix in `form`."""
    return f"{qtype}-imat.gguf" if form == "gguf" else f"{qtype}-imat-dat.gguf"


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return all(np.array_equal(a[n].view(np.uint32), b[n].view(np.uint32)) for n in a)


def _write_text(text: str, path: Path) -> None:
    path.write_text(text, encoding="utf-8")


def _collect_and_write(out: Path, source: Path) -> tuple[dict[str, dict[str, np.ndarray]], int]:
    """Both text sets' imatrices in both forms; returns the english one's weights per form and its chunk count."""
    english: tuple[dict[str, dict[str, np.ndarray]], int] | None = None
    for set_name, text in text_sets().items():
        dataset = f"texts-{set_name}.txt"
        produce(out / dataset, partial(_write_text, text))
        log(f"collecting the {set_name} mixture-of-experts importance matrix")
        sums, counts, tokens = collect(source, text)
        check_routing(counts, tokens, int(MOE.config["num_experts_per_tok"]))
        for suffix, write in (("gguf", write_gguf), ("dat", write_dat)):
            produce(out / f"imatrix-{set_name}.{suffix}",
                    partial(write, sums=sums, counts=counts, dataset=dataset, chunks=tokens // CHUNK_TOKENS))
        if set_name == "english":
            english = quantize_weights(sums, counts), tokens // CHUNK_TOKENS
    assert english is not None
    log(f"the two forms give {'the same' if _same(*english[0].values()) else 'different'} weights")
    return english


def build_imatrix_moe(cache: Path) -> None:
    """source/, imatrix-{english,numbers}.{gguf,dat} of a tiny qwen3moe, then <qtype>-imat.gguf and
    <qtype>-imat-dat.gguf quantized (from a transient F32 conversion) with the english imatrix's GGUF and
    .dat forms (LAST_FILE last)."""
    tree = llama_cpp_tree(cache)
    out = cache / FOLDER
    out.mkdir(exist_ok=True)
    source = produce(out / "source", _make_source(tree, MOE))
    if (out / LAST_FILE).exists():
        return
    base = convert(tree, source, "f32", out / "F32.gguf")
    weights, chunks = _collect_and_write(out, source)
    for form in ("gguf", "dat"):
        for qtype in QTYPES:
            produce(out / quantized_name(qtype, form), partial(
                quantize_with, base, IMATRIX_FTYPES[qtype], weights[form], f"imatrix-english.{form}",
                "texts-english.txt", chunks))
    base.unlink()  # only the quantizer's input; the tests verify against source/
