"""Gate 2's causal-LM comparison holds logits for one block of positions at a time: on a 262,144-token
vocabulary and a 1,000-token text, the verification's peak anonymous memory (the engine and its llama.cpp
child together) grows by at most LOGITS_BOUND over the same run on a 10-token text, where holding every
position's logits (as gate 2 did) took gigabytes. And the figures are those of the whole-matrix
comparison: transformers' own forward over the text, llama.cpp decoding it in one batch, one
log-softmax per position, as gate 2 computed them before it streamed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.gates.runtime.logit_math import ROW_BYTES
from engine.gates.runtime.logits_stream import KEPT_ROWS, LOGITS_BLOCK_BYTES
from engine.runtime.llama_candidate import DECODE_BATCH_BYTES

pytestmark = pytest.mark.slow
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from process_tree import Sampler  # noqa: E402

VOCABULARY = 262_144
# What may grow with a text's positions, from the constants that bound it (docs/gates.md): this process holds
# llama.cpp's rows of a block, the reference's (and the source's) and a float64 temporary set; the child holds
# its output buffer, a copy of it and the reply; both keep the negative control's first rows; plus what a
# block's bookkeeping and the allocator add. Hidden states and per-position figures are kilobytes here.
LOGITS_BOUND = 3 * LOGITS_BLOCK_BYTES + 6 * ROW_BYTES + 3 * DECODE_BATCH_BYTES + 2 * KEPT_ROWS * VOCABULARY * 4 \
    + (96 << 20)
LONG_TOKENS = 1000


def long_text(source: Path, tokens: int) -> str:
    """English prose repeated past `tokens` tokens of the fixture's tokenizer, cut back to them."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(source / "tokenizer.json"))
    prose = (Path(__file__).resolve().parents[2] / "examples" / "english.txt").read_text().replace("\n", " ")
    text = prose
    while len(tokenizer.encode(text).ids) < tokens + 50:
        text += " " + prose
    words = text.split()
    while len(tokenizer.encode(" ".join(words)).ids) > tokens - 2:  # BOS and room for the tokenizers to differ
        words.pop()
    return " ".join(words)


def verify_measured(root: Path, text: str, tmp_path: Path) -> tuple[dict, float]:
    """gate 2 in a fresh process: its report and the peak RssAnon of its process tree, MiB."""
    texts, policy = tmp_path / f"{len(text)}.txt", tmp_path / "policy.json"
    texts.write_text(text + "\n")
    policy.write_text(json.dumps({"max_logit_positions": 1024}))
    process = subprocess.Popen([sys.executable, "-m", "service", "verify", "--source", str(root / "source"),
                                "--artifact", str(root / "big-vocab-F32.gguf"), "--gates", "2", "--texts", str(texts),
                                "--policy", str(policy), "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    sampler = Sampler(process.pid)
    out, err = process.communicate()
    sampler.stop()
    assert process.returncode in (0, 1), err[-3000:]
    return json.JSONDecoder().raw_decode(out)[0], sampler.anon / 1024


def whole_matrix_figures(root: Path, text: str) -> dict[str, float]:
    """The comparison as gate 2 made it before streaming: whole logits from both runtimes (llama.cpp in one
    batch of the whole text), then per-position KL, NMSE and top-1 (row chunks here only to spare memory:
    each position's figures depend on its own row alone)."""
    import torch
    from llama_cpp import Llama
    from transformers import AutoModelForCausalLM

    llm = Llama(str(root / "big-vocab-F32.gguf"), logits_all=True, n_ctx=2048, n_batch=2048, n_ubatch=2048,
                verbose=False)
    ids = llm.tokenize(text.encode(), add_bos=True, special=False)
    llm.eval(ids)
    candidate = np.asarray(llm.scores[: len(ids)], dtype=np.float32)
    llm.close()
    model = AutoModelForCausalLM.from_pretrained(root / "source", dtype=torch.float32).eval()
    with torch.inference_mode():
        tensor = torch.tensor([ids])
        reference = model(input_ids=tensor, attention_mask=torch.ones_like(tensor)).logits[0].numpy()
    kl, sum_sq_diff, sum_sq_ref, top1 = [], 0.0, 0.0, 0
    for start in range(0, len(ids), 16):
        ref, cand = reference[start:start + 16].astype(np.float64), candidate[start:start + 16].astype(np.float64)
        log_p = ref - ref.max(-1, keepdims=True)
        log_p -= np.log(np.exp(log_p).sum(-1, keepdims=True))
        log_q = cand - cand.max(-1, keepdims=True)
        log_q -= np.log(np.exp(log_q).sum(-1, keepdims=True))
        kl.append((np.exp(log_p) * (log_p - log_q)).sum(-1))
        sum_sq_diff += float(((ref - cand) ** 2).sum())
        sum_sq_ref += float((ref**2).sum())
        top1 += int((ref.argmax(-1) == cand.argmax(-1)).sum())
    kls = np.concatenate(kl)
    return {"positions": len(ids), "nmse": sum_sq_diff / sum_sq_ref, "kl_mean": float(kls.mean()),
            "top1_agreement": top1 / len(ids)}


def test_a_1000_token_text_on_a_262k_vocabulary_stays_within_the_bound(big_vocab: Path, tmp_path: Path):
    text = long_text(big_vocab / "source", LONG_TOKENS)
    short, short_peak = verify_measured(big_vocab, "The quick brown fox jumps over the lazy dog.", tmp_path)
    long, long_peak = verify_measured(big_vocab, text, tmp_path)
    summary = long["gates"]["runtime"]["details"]["logits"]["summary"]
    assert short["gates"]["runtime"]["status"] != "not_run" and summary["positions"] > 900
    growth = long_peak - short_peak
    print(f"peak anonymous memory: {short_peak:.0f} MiB (10 tokens), {long_peak:.0f} MiB ({summary['positions']}"
          f" positions); growth {growth:.0f} MiB, bound {LOGITS_BOUND / 2**20:.0f} MiB")
    assert growth <= LOGITS_BOUND / 2**20
    whole = whole_matrix_figures(big_vocab, text)
    first = long["gates"]["runtime"]["details"]["logits"]["per_text"][0]  # the text; the probe's follow
    assert first["positions"] == whole["positions"]
    assert first["kl_mean"] == pytest.approx(whole["kl_mean"], rel=1e-3, abs=1e-9)
    assert first["top1_equal"] == pytest.approx(whole["top1_agreement"] * whole["positions"], abs=2)
