"""Gate 2's chat check on a trained chat model (SmolLM2-135M-Instruct): every probe conversation rendered by
llama.cpp's built-in path, llama-cpp-python's Jinja formatter and the llama-server --jinja path tokenizes to
transformers' apply_chat_template ids on the honest file; a changed template, a missing one and a BOS a
runtime path adds on top of the template's are each NO-GO with their own code.

The check is called as gate 2 calls it (a real llama.cpp child per file, the source's tokenizer through
transformers); gate 2 runs it only for causal LMs, which test_trained_models.py covers end to end.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from engine.formats.gguf_structure import read_layout
from engine.formats.source import open_source
from engine.gates.runtime.chat_template import CONVERSATIONS, check_chat_template
from engine.runtime.llama_process import LlamaProcess
from tests.gguf_rewrite import rewrite

pytestmark = pytest.mark.slow
BOS_FIRST = "{{ bos_token }}"


def checked(source_dir: Path, artifact: Path) -> tuple[list, dict]:
    details: dict = {}
    with LlamaProcess(artifact, embedding=False, n_ctx=256) as candidate:
        found = check_chat_template(open_source(source_dir), read_layout(artifact), candidate, details)
    return found, details


def test_the_honest_file_renders_every_conversation_as_transformers_does(smollm2):
    found, details = checked(smollm2 / "source", smollm2 / "smollm2-Q4_0.gguf")
    assert not found, found
    rows = details["chat_template"]["conversations"]
    assert len(rows) == len(CONVERSATIONS)
    assert all(row[path] == "equal" for row in rows for path in ("builtin", "jinja", "jinja_server")), rows


def _template(source: Path) -> str:
    return (source / "chat_template.jinja").read_text(encoding="utf-8")


def test_a_template_that_renders_other_ids_is_no_go(smollm2, tmp_path):
    changed = _template(smollm2 / "source").replace("'<|im_start|>' + message['role'] + '\n'",
                                                    "'<|im_start|>' + message['role'] + ': '")
    artifact = rewrite(smollm2 / "smollm2-Q4_0.gguf", tmp_path / "twin.gguf",
                       set_keys={"tokenizer.chat_template": changed})
    found, _ = checked(smollm2 / "source", artifact)
    assert {b.code for b in found} == {"chat.template_mismatch"}
    assert all(b.key == "tokenizer.chat_template" for b in found)
    assert any("Jinja" in b.why for b in found)


def test_a_gguf_without_the_sources_template_is_no_go(smollm2, tmp_path):
    from tests.mutation import gguf_edit

    gguf = gguf_edit.read(smollm2 / "smollm2-Q4_0.gguf")
    stripped = gguf_edit.GGUFFile(gguf.version, [kv for kv in gguf.kvs if kv.key != "tokenizer.chat_template"],
                                  gguf.tensors, gguf.alignment)
    artifact = gguf_edit.write(stripped, tmp_path / "twin.gguf")
    found, _ = checked(smollm2 / "source", artifact)
    assert "chat.template_mismatch" in {b.code for b in found}
    assert any("has none" in b.why for b in found)


def test_a_bos_the_template_writes_is_dropped_by_llama_server_as_common_chat_does(smollm2, tmp_path):
    """Both templates start with the BOS token and the GGUF asks for an automatic BOS: llama-server --jinja
    drops the rendered one before tokenizing (common/chat.cpp), so it gives one BOS, as transformers does."""
    source = tmp_path / "source"
    shutil.copytree(smollm2 / "source", source)
    template = BOS_FIRST + _template(source)
    (source / "chat_template.jinja").write_text(template, encoding="utf-8")
    artifact = rewrite(smollm2 / "smollm2-Q4_0.gguf", tmp_path / "twin.gguf",
                       set_keys={"tokenizer.chat_template": template, "tokenizer.ggml.add_bos_token": True})
    found, details = checked(source, artifact)
    rows = details["chat_template"]["conversations"]
    assert all(row["jinja"] == "equal" and row["jinja_server"] == "equal" for row in rows), rows
    assert "chat.double_bos" not in {b.code for b in found}, found


class _DoublingRuntime:
    """A runtime path that tokenizes a prompt its template already began with BOS with an automatic BOS on
    top (a fake: llama.cpp 0.3.36's three paths all avoid it, so the real child cannot show the defect)."""

    def vocab_facts(self) -> dict:
        return {"bos": 1}

    def render_chat(self, messages, add_generation_prompt, source_dir) -> dict:
        hf = [1, 7, 8, 9]
        return {"hf": {"ids": hf}, "builtin": {"ids": hf}, "jinja": {"ids": hf}, "jinja_server": {"ids": [1, *hf]}}


def test_a_runtime_path_that_doubles_the_bos_is_no_go_naming_the_flag(smollm2):
    found = check_chat_template(open_source(smollm2 / "source"), read_layout(smollm2 / "smollm2-Q4_0.gguf"),
                                _DoublingRuntime(), {})
    assert {b.code for b in found} == {"chat.double_bos"} and len(found) == len(CONVERSATIONS)
    assert all(b.key == "tokenizer.ggml.add_bos_token" and "--jinja" in b.why for b in found)
