"""Gate 2's streamed reference (engine/runtime/streamed_model.py): bit for bit the whole-model
reference on every architecture the project maps and on BF16/F16/sharded sources, and within an
RSS budget computed from the model's shapes, which the whole-model reference exceeds."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.errors import SourceError
from engine.runtime.checkpoints import SafetensorsCheckpoint, checkpoint_index
from engine.runtime.hf_reference import HFModel
from engine.runtime.streamed_model import Loading, load_persistent_buffers, materialized_parameters, streamed_model
from tests.conftest import REPO

pytestmark = pytest.mark.slow


LENGTHS = (9, 80)


def token_ids(source: Path) -> list[list[int]]:
    """Seeded ids within the model's vocabulary, one short and one long sequence (past the fixtures'
    sliding windows); drawn rather than tokenized, as loading a 250k-token tokenizer.json costs seconds."""
    vocab = json.loads((source / "config.json").read_text())["vocab_size"]
    rng = np.random.default_rng(12)
    return [[int(i) for i in rng.integers(3, vocab, size=n)] for n in LENGTHS]


def assert_same_outputs(source: Path, kind: str) -> None:
    """Streamed and whole-model references on the same ids: identical arrays, and the streamed model
    holds no weights once a forward is over."""
    flags = {"causal": kind == "causal", "classifier": kind == "reranker"}
    whole, streamed = HFModel(source, streamed=False, **flags), HFModel(source, **flags)
    for ids in token_ids(source):
        if kind == "embedding":
            expected, got = whole._forward(ids).last_hidden_state, streamed._forward(ids).last_hidden_state
            assert np.array_equal(expected.numpy(), got.numpy())
            assert np.array_equal(whole.embed(ids, "mean"), streamed.embed(ids, "mean"))
        elif kind == "causal":  # the head on given rows (how gate 2 asks) gives the model's own forward's numbers
            expected = whole._forward(ids).logits[0].double().numpy()
            assert np.array_equal(expected, whole.logits(ids))
            assert np.array_equal(expected, streamed.logits(ids))
            # 4 rows through the head against every row: BLAS may take another kernel for the smaller matrix (an
            # AVX-512 CPU does, a few float32 ulps apart); the numbers of the same head, not of the same kernel
            np.testing.assert_allclose(streamed.head(streamed.hidden(ids)[3:7]), expected[3:7], rtol=0, atol=2e-6)
        else:
            assert np.array_equal(whole.logits(ids), streamed.logits(ids))
    assert materialized_parameters(streamed.model) == 0
    assert materialized_parameters(whole.model) > 0


def test_streamed_equals_whole_model_on_encoders(stream_everything, minilm, qwen3, xlm_roberta, xlm_roberta_spm,
                                                 modernbert):
    for source in (minilm / "source", qwen3 / "source", xlm_roberta / "source", xlm_roberta_spm / "source",
                   modernbert / "source"):
        assert_same_outputs(source, "embedding")


def test_streamed_equals_whole_model_on_the_reranker_head(stream_everything, bge_reranker):
    assert_same_outputs(bge_reranker / "source", "reranker")


def test_streamed_equals_whole_model_on_decoders(stream_everything, decoders, tiny_llama):
    for source in [folder / "source" for folder in decoders.values()] + [tiny_llama / "source"]:
        assert_same_outputs(source, "causal")


def recast_copy(source: Path, out: Path, dtype_name: str, shards: int = 1) -> Path:
    """A copy of `source` whose floating tensors are stored as `dtype_name`, split over `shards` files
    with an index when shards > 1 (the layout of every large Hub checkpoint)."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, out, ignore=shutil.ignore_patterns("*.safetensors"))
    tensors = {key: (t.to(getattr(torch, dtype_name)) if t.is_floating_point() else t)
               for key, t in load_file(str(source / "model.safetensors")).items()}
    if shards == 1:
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        return out
    keys, weight_map = sorted(tensors), {}
    for index in range(shards):
        name = f"model-{index + 1:05d}-of-{shards:05d}.safetensors"
        part = {key: tensors[key] for key in keys[index::shards]}
        save_file(part, str(out / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, name))
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return out


def test_streamed_equals_whole_model_on_bf16_f16_and_sharded_sources(stream_everything, decoders, qwen3, tmp_path):
    """A BF16 or F16 source is cast to float32 per module exactly as from_pretrained casts it whole."""
    assert_same_outputs(recast_copy(decoders["llama"] / "source", tmp_path / "llama-bf16", "bfloat16"), "causal")
    assert_same_outputs(recast_copy(decoders["mistral"] / "source", tmp_path / "mistral-f16", "float16"), "causal")
    assert_same_outputs(recast_copy(qwen3 / "source", tmp_path / "qwen3-bf16", "bfloat16", shards=3), "embedding")
    assert_same_outputs(recast_copy(decoders["qwen3moe"] / "source", tmp_path / "moe", "float32", shards=2), "causal")


def renamed_copy(source: Path, out: Path, rename) -> Path:
    """A copy of `source` whose checkpoint keys are renamed by `rename` (key -> key)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, out, ignore=shutil.ignore_patterns("*.safetensors"))
    tensors = {rename(key): t for key, t in load_file(str(source / "model.safetensors")).items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def test_checkpoint_keys_are_renamed_as_from_pretrained_renames_them(stream_everything, decoders, qwen3, minilm,
                                                                      tmp_path):
    """A base model saved inside its task model ("model." prefix), a task model saved as its base model
    (no prefix, tied head), and BERT's legacy LayerNorm gamma/beta names."""
    assert_same_outputs(renamed_copy(qwen3 / "source", tmp_path / "prefixed", lambda k: f"model.{k}"), "embedding")
    unprefixed = renamed_copy(decoders["llama"] / "source", tmp_path / "bare", lambda k: k.removeprefix("model."))
    assert_same_outputs(unprefixed, "causal")
    legacy = renamed_copy(minilm / "source", tmp_path / "legacy", lambda k: k.replace(
        "LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"))
    assert_same_outputs(legacy, "embedding")


def test_a_small_model_stays_resident_after_its_first_text(minilm):
    """MiniLM's 90 MB of float32 weights fit in RESIDENT_BYTES: read once, then kept, same outputs."""
    source = minilm / "source"
    whole, kept = HFModel(source, causal=False, streamed=False), HFModel(source, causal=False)
    assert materialized_parameters(kept.model) == 0
    for ids in token_ids(source):
        assert np.array_equal(whole.embed(ids, "mean"), kept.embed(ids, "mean"))
    assert materialized_parameters(kept.model) == materialized_parameters(whole.model)


def test_a_tied_head_reads_the_input_embedding_as_from_pretrained_leaves_it(stream_everything, decoders, tmp_path):
    """A tied checkpoint that also stores a (different) lm_head.weight: from_pretrained re-ties the head
    to the input embedding after loading, so the stored head is ignored; the streamed reference too."""
    import torch
    from safetensors.torch import load_file, save_file

    source = shutil.copytree(decoders["llama"] / "source", tmp_path / "tied-with-head")
    assert json.loads((source / "config.json").read_text())["tie_word_embeddings"] is True
    tensors = load_file(str(source / "model.safetensors"))
    embedding = tensors["model.embed_tokens.weight"]
    tensors["lm_head.weight"] = torch.randn(embedding.shape, generator=torch.Generator().manual_seed(3))
    save_file(tensors, str(source / "model.safetensors"), metadata={"format": "pt"})
    assert_same_outputs(source, "causal")


def test_a_shape_mismatch_is_refused_like_from_pretrained(decoders, tmp_path):
    from safetensors.torch import load_file, save_file

    source = shutil.copytree(decoders["llama"] / "source", tmp_path / "mismatch")
    tensors = load_file(str(source / "model.safetensors"))
    tensors["model.norm.weight"] = tensors["model.norm.weight"][:-1].clone()
    save_file(tensors, str(source / "model.safetensors"), metadata={"format": "pt"})
    for streamed in (True, False):
        with pytest.raises(SourceError) as raised:
            HFModel(source, causal=True, streamed=streamed).logits([1, 2, 3])
        assert raised.value.code == "source.unsupported_architecture"
        assert ("size mismatch for model.norm.weight" in str(raised.value)) is streamed


def test_persistent_buffers_in_the_checkpoint_are_loaded_and_kept(tmp_path):
    """A buffer saved in the checkpoint replaces the constructed value, as from_pretrained loads it
    (an integer buffer keeps its dtype); a buffer absent from the checkpoint keeps its value."""
    import torch
    from safetensors.torch import save_file

    class Holder(torch.nn.Module):
        base_model_prefix = ""  # what transformers' renaming asks of a model

        def __init__(self) -> None:
            super().__init__()
            self.inner = torch.nn.Module()
            self.inner.register_buffer("ids", torch.zeros(4, dtype=torch.long))
            self.register_buffer("scale", torch.zeros(2, dtype=torch.bfloat16))
            self.register_buffer("kept", torch.full((2,), 7.0))

    save_file({"inner.ids": torch.arange(4), "scale": torch.ones(2, dtype=torch.bfloat16)},
              str(tmp_path / "model.safetensors"))
    model = Holder()
    files = {"inner.ids": tmp_path / "model.safetensors", "scale": tmp_path / "model.safetensors"}
    load_persistent_buffers(Loading(model, SafetensorsCheckpoint(files)))
    assert model.inner.ids.tolist() == [0, 1, 2, 3] and model.inner.ids.dtype == torch.long
    assert model.scale.dtype == torch.float32 and model.scale.tolist() == [1.0, 1.0]
    assert model.kept.tolist() == [7.0, 7.0]


def test_a_source_missing_a_parameter_falls_back_to_the_whole_model(xlm_roberta, tmp_path):
    """transformers initialises a missing parameter at random; that cannot be streamed bit for bit,
    so the reference is loaded whole, as before (here the pooler, which embeddings do not read)."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModel

    source = shutil.copytree(xlm_roberta / "source", tmp_path / "no-pooler")
    tensors = {k: t for k, t in load_file(str(source / "model.safetensors")).items() if not k.startswith("pooler.")}
    save_file(tensors, str(source / "model.safetensors"), metadata={"format": "pt"})
    assert streamed_model(AutoModel, source) is None
    reference = HFModel(source, causal=False)
    ids = token_ids(source)[0]
    assert np.array_equal(reference.embed(ids, "cls"), HFModel(xlm_roberta / "source", causal=False).embed(ids, "cls"))
    assert materialized_parameters(reference.model) > 0


# --- the memory bound -------------------------------------------------------------------------------

BIG = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 768,
       "intermediate_size": 2048, "num_hidden_layers": 32, "num_attention_heads": 12, "num_key_value_heads": 4,
       "head_dim": 64, "vocab_size": 8192, "max_position_embeddings": 512, "tie_word_embeddings": True,
       "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "torch_dtype": "bfloat16"}
PROMPT = list(range(1, 65))
# allocator rounding, the first call of each kernel, Python objects: what the shapes do not give. A clean-clone
# run on this suite's 2-core AVX-512 machine measured 146 MiB of growth over the baseline where the shapes
# give 63 MiB (another run, 76 MiB): 64 MiB of slack failed it by 19 MiB. The whole model stays 400+ MiB above.
SLACK_BYTES = 128 * 2**20

STREAMED_BELOW = 1 << 28  # the child's resident limit: RESIDENT_BYTES (1 GiB) would keep this 0.8 GB model
CHILD = """
import json, sys
from pathlib import Path
import torch
from transformers.models.qwen3 import modeling_qwen3  # noqa: F401  (imported before the baseline)
from engine.runtime import streamed_model
from engine.runtime.hf_reference import HFModel

streamed_model.RESIDENT_BYTES = int(sys.argv[4])  # below the model, so it is streamed, not kept

def hwm_kib():
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))

with torch.inference_mode():  # the first call of matmul, softmax and sdpa allocates their workspaces
    q = torch.randn(1, 4, 8, 16)
    torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).softmax(-1) @ torch.randn(16, 16)
model = HFModel(Path(sys.argv[1]), causal=True, **({} if sys.argv[2] == "streamed" else {"streamed": False}))
baseline = hwm_kib()
logits = model.logits(json.loads(sys.argv[3]))
print(json.dumps({"baseline_kib": baseline, "peak_kib": hwm_kib(), "shape": list(logits.shape),
                  "finite": bool((logits == logits).all())}))
"""


def build_random_model(out: Path, config: dict | None = None) -> Path:
    """A random-weight BF16 Qwen3 causal LM of ~207M parameters in 32 blocks: 0.8 GB in float32,
    its largest module (the tied embedding) 25 MB."""
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = config or BIG
    out.mkdir()
    (out / "config.json").write_text(json.dumps(config))
    with torch.device("meta"):
        shapes = {name: p.shape for name, p in Qwen3ForCausalLM(Qwen3Config(**config)).named_parameters()}
    generator = torch.Generator().manual_seed(12)
    tensors = {name: (torch.ones(shape) if name.endswith("norm.weight") else torch.randn(shape, generator=generator)
                      * 0.02).to(torch.bfloat16) for name, shape in shapes.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def largest_module_parameters(config: dict) -> int:
    """The largest single module of a Qwen3 decoder, from its shapes: the embedding (tied to the head)
    or a projection of a block."""
    hidden, heads, head_dim = config["hidden_size"], config["num_attention_heads"], config["head_dim"]
    return max(config["vocab_size"] * hidden, hidden * config["intermediate_size"], hidden * heads * head_dim)


def rss_budget(config: dict, baseline_bytes: int, source_bytes_per_weight: int) -> int:
    """The README's bound for a model larger than RESIDENT_BYTES: baseline + the largest module in
    float32 and in its source dtype + the activations of the longest text (logits in float32 and
    float64, hidden states, attention) + slack."""
    largest = largest_module_parameters(config) * (4 + source_bytes_per_weight)
    tokens = len(PROMPT)
    activations = tokens * config["vocab_size"] * (4 + 8) * 2 + 16 * tokens * config["intermediate_size"] * 4 \
        + tokens * tokens * config["num_attention_heads"] * 4 * 4
    return baseline_bytes + largest + activations + SLACK_BYTES


def peak_of(source: Path, mode: str, prompt: list[int] = PROMPT) -> dict:
    """VmHWM of a child process running the reference once: the child's own peak of resident memory,
    file-backed pages included (the streamed reader drops each safetensors mapping after its read, so
    they only count transiently; no GGUF is mapped in this child)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", CHILD, str(source), mode, json.dumps(prompt), str(STREAMED_BELOW)],
                          env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_streamed_reference_peak_is_within_the_budget_from_the_shapes(tmp_path):
    source = build_random_model(tmp_path / "big")
    hidden, head_dim = BIG["hidden_size"], BIG["head_dim"]
    block = hidden * head_dim * 2 * (BIG["num_attention_heads"] + BIG["num_key_value_heads"]) \
        + 3 * hidden * BIG["intermediate_size"]
    parameters = BIG["vocab_size"] * hidden + BIG["num_hidden_layers"] * block
    assert parameters * 4 > 3 * STREAMED_BELOW  # streamed, not kept
    streamed = peak_of(source, "streamed")
    assert streamed["shape"] == [len(PROMPT), BIG["vocab_size"]] and streamed["finite"]
    budget = rss_budget(BIG, streamed["baseline_kib"] * 1024, source_bytes_per_weight=2)
    assert streamed["peak_kib"] * 1024 <= budget, (streamed, budget)
    whole = peak_of(source, "whole")
    assert whole["peak_kib"] * 1024 > rss_budget(BIG, whole["baseline_kib"] * 1024, source_bytes_per_weight=2) \
        + parameters * 4 // 2, (whole, parameters)


def test_a_shard_index_naming_files_outside_the_source_is_not_streamed(tmp_path):
    """Shard names are plain file names in the source folder; anything else is left to from_pretrained."""
    index = {"weight_map": {"a.weight": "model-00001-of-00002.safetensors", "b.weight": "../elsewhere.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert checkpoint_index(tmp_path) is None
    index["weight_map"]["b.weight"] = "model-00002-of-00002.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert checkpoint_index(tmp_path) == {"a.weight": tmp_path / "model-00001-of-00002.safetensors",
                                          "b.weight": tmp_path / "model-00002-of-00002.safetensors"}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": ["a"]}))
    assert checkpoint_index(tmp_path) is None


WIDE = {**BIG, "hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 24, "num_attention_heads": 8,
        "num_key_value_heads": 4, "vocab_size": 131072}
SHORT = list(range(1, 17))


def test_a_streamed_vocabulary_costs_its_rows_and_one_head_chunk_not_the_table(tmp_path):
    """A 131k-token vocabulary (Llama 3's size) on a small model: the tied embedding is 268 MB in float32,
    every other module under 3 MB. Streamed, the embedding reads only the rows of the text's ids and the
    head is applied HEAD_CHUNK_BYTES at a time, so the peak is the baseline + one block's largest module +
    one head chunk (in float32 and as read) + the logits: the table never is resident."""
    from engine.runtime.streamed_model import HEAD_CHUNK_BYTES

    source = build_random_model(tmp_path / "wide", WIDE)
    streamed = peak_of(source, "streamed", SHORT)
    assert streamed["shape"] == [len(SHORT), WIDE["vocab_size"]] and streamed["finite"]
    hidden = WIDE["hidden_size"]
    block_module = max(hidden * WIDE["intermediate_size"], hidden * WIDE["num_attention_heads"] * WIDE["head_dim"])
    logits = len(SHORT) * WIDE["vocab_size"] * (4 + 8) * 2
    budget = streamed["baseline_kib"] * 1024 + block_module * (4 + 2) + HEAD_CHUNK_BYTES * 3 // 2 + logits \
        + SLACK_BYTES
    table = WIDE["vocab_size"] * hidden * (4 + 2)
    assert streamed["peak_kib"] * 1024 <= budget < streamed["baseline_kib"] * 1024 + table, (streamed, budget, table)

