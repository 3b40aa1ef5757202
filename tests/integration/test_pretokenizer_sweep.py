"""The pre-tokenizer sweep: `tokenizer.ggml.pre` renamed to every other type llama.cpp knows, on every fixture
with a BPE vocabulary. Each rename whose rules split the probe differently must be NO-GO naming the key.

What is real: the renamed files are loaded by llama.cpp (vocabulary only: the pre-tokenizer is a
tokenizer setting, and weights would make 450 loads slow) in a child process (some renames make
llama.cpp abort while tokenizing: gate 2 reports that as `runtime.crashed`; the sweep counts it apart),
the names are read from the llama.cpp source the suite builds against (src/llama-vocab.cpp), and the
decision is gate 2's own tokenizer comparison (`check_tokenizer`) over the built-in probe. A rename that
changes only the automatic BOS (llama3's type adds one where the file sets no flag) is named too.
Whether a rename's rules differ is decided by llama.cpp itself: its ids on the probe under the rename
against its ids under the file's own name. The closing note of issue 20 quotes the counts it prints.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from engine.gates.runtime.tokenizer_parity import PROBE, check_tokenizer
from engine.runtime.hf_reference import HFTokenizer
from engine.texts import PROBE_TEXTS
from tests.conftest import built, fixtures_root
from tests.mutation import gguf_edit

pytestmark = pytest.mark.slow
CHILD = Path(__file__).with_name("vocab_child.py")
CHILDREN = min(2, os.cpu_count() or 1)  # renames are loaded this many at a time, each in its own child
TEXTS = (*(t.text for t in PROBE_TEXTS), PROBE)  # the probe, and the word gate 2 finds the added tokens with
# (fixture folder, a GGUF of it): every fixture whose tokenizer is BPE (tokenizer.ggml.model = gpt2)
BPE_FIXTURES = (("smollm2", "smollm2-Q4_0.gguf"), ("tiny-qwen3", "tiny-qwen3-F16.gguf"), ("arch-qwen2", "F16.gguf"),
                ("arch-qwen3moe", "F16.gguf"), ("imatrix-moe", "Q4_K_M-imat.gguf"))


def known_pre_types() -> list[str]:
    source = next(fixtures_root().glob("llama.cpp-*")) / "src" / "llama-vocab.cpp"
    return sorted(set(re.findall(r'tokenizer_pre == "([^"]+)"', source.read_text(encoding="utf-8"))))


class VocabChild:
    """llama.cpp's tokenizer for GGUFs loaded without their weights, in a child that may die (restarted)."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[str] | None = None

    def tokenize_all(self, path: Path) -> dict[tuple[str, tuple[bool, bool]], list[int]] | str:
        """Every probe text in every flag combination, or why there are none ('crashed: ...', 'refused: ...')."""
        if self.process is None or self.process.poll() is not None:
            self.process = subprocess.Popen([sys.executable, str(CHILD)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            stderr=subprocess.DEVNULL, text=True)
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps({"path": str(path), "texts": list(TEXTS)}) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            code = self.process.wait()
            self.close()
            return f"crashed: {signal.Signals(-code).name if code < 0 else code}"
        reply = json.loads(line)
        if "error" in reply:
            return f"refused: {reply['error']}"
        return {(TEXTS[int(i)], (a == "True", p == "True")): ids
                for key, ids in reply["ids"].items() for i, a, p in [key.split(",")]}

    def close(self) -> None:
        if self.process is not None:
            for stream in (self.process.stdin, self.process.stdout):
                if stream is not None:
                    stream.close()
            self.process.wait()
            self.process = None


def replayed(ids: dict[tuple[str, tuple[bool, bool]], list[int]]) -> Any:
    """A tokenize function answering from `ids` (what llama.cpp said), as gate 2's comparison calls it."""

    def tokenize(text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        return ids[(text, (add_special, parse_special))]

    return tokenize


def _vocab_only_copy(gguf: gguf_edit.GGUFFile, pre: str, path: Path, encoded: dict[str, bytes]) -> Path:
    kvs = [kv if kv.key != "tokenizer.ggml.pre" else replace(kv, value=pre) for kv in gguf.kvs]
    return gguf_edit.write(gguf_edit.GGUFFile(gguf.version, kvs, [], gguf.alignment), path, encoded)


def tokenized_under(gguf: gguf_edit.GGUFFile, names: list[str], folder: Path) -> dict[str, Any]:
    """llama.cpp's ids (or why there are none) for the file with `tokenizer.ggml.pre` set to each name.

    The 151k-token vocabularies are encoded once (only the renamed key changes) and loaded by CHILDREN
    children at once: a vocabulary load is most of a rename's cost."""
    encoded = {kv.key: gguf_edit.kv_bytes(kv) for kv in gguf.kvs if kv.key != "tokenizer.ggml.pre"}
    idle: queue.Queue[VocabChild] = queue.Queue()
    children = [VocabChild() for _ in range(CHILDREN)]
    for child in children:
        idle.put(child)

    def one(name: str) -> Any:
        child = idle.get()
        try:
            path = _vocab_only_copy(gguf, name, folder / f"{name}.gguf", encoded)
            ids = child.tokenize_all(path)
            path.unlink()
            return ids
        finally:
            idle.put(child)

    try:
        with ThreadPoolExecutor(CHILDREN) as pool:
            return dict(zip(names, pool.map(one, names), strict=True))
    finally:
        for child in children:
            child.close()


@pytest.mark.parametrize(("folder", "artifact"), BPE_FIXTURES)
def test_every_rename_whose_rules_differ_on_the_probe_is_no_go_naming_the_key(folder, artifact, tmp_path):
    root = built(folder, artifact)
    gguf = gguf_edit.read(root / artifact)
    metadata = {kv.key: kv.value for kv in gguf.kvs}
    assert metadata["tokenizer.ggml.model"] == "gpt2"
    own = metadata["tokenizer.ggml.pre"]
    hf = HFTokenizer(root / "source" / "tokenizer.json")
    renames = [name for name in known_pre_types() if name != own]
    under = tokenized_under(gguf, [own, *renames], tmp_path)
    truth = under[own]
    assert isinstance(truth, dict), truth
    result = check_tokenizer(PROBE_TEXTS, hf.encode, replayed(truth), hf.raw, metadata, True)
    assert not result.blockers, f"the honest {folder} file is refused by the probe: {result.blockers}"
    counts = {"renamed": 0, "differ": 0, "caught": 0, "crashed": 0, "refused_to_load": 0, "same": 0}
    missed, died = [], []
    for pre in renames:
        counts["renamed"] += 1
        ids = under[pre]
        if isinstance(ids, str):  # llama.cpp died or refused the name: gate 2 is NO-GO (crashed, load_failed)
            counts["crashed" if ids.startswith("crashed") else "refused_to_load"] += 1
            died.append(f"{pre} ({ids})")
            continue
        if ids == truth:
            counts["same"] += 1
            continue
        counts["differ"] += 1
        found = check_tokenizer(PROBE_TEXTS, hf.encode, replayed(ids), hf.raw,
                                {**metadata, "tokenizer.ggml.pre": pre}, True).blockers
        if any(b.key == "tokenizer.ggml.pre" for b in found):
            counts["caught"] += 1
        else:
            missed.append(pre)
    print(f"\npre-tokenizer sweep on {folder} (own type {own!r}): {counts}; llama.cpp died or refused: {died}",
          file=sys.stderr)
    assert not missed, f"renames whose rules differ on the probe but passed: {missed}"
    assert counts["caught"] == counts["differ"] > 0
