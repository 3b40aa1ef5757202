"""Gate 2, chat: a conversation rendered as a runtime renders it gives the token ids transformers gives.

Why: a chat model is used through its template. Gate 1 compares the template's text with the source's,
but what a user's runtime feeds the model is the rendered conversation, tokenized by the runtime's rules:
llama.cpp's built-in template path (`llama_chat_apply_template`, what llama-cli and llama-server use without
`--jinja`) tokenizes the prompt adding BOS when the GGUF says so; llama-cpp-python's Jinja formatter renders
the GGUF's own template and adds nothing; llama-server with `--jinja` renders it and adds BOS when the GGUF
says so. Each must give the ids of transformers' `apply_chat_template` on the source. A BOS written by the
template and added again by the runtime (two BOS tokens in front) is a defect of its own: the model was
never trained on it.

The probe conversations all carry a system message: a template's default system prompt (SmolLM2 writes one
when none is given) is the template's own choice, which llama.cpp's built-in path does not reproduce for
any file, honest or not. A conversation the source's template itself refuses (a role it does not support)
is skipped for every path. A GGUF template no built-in path recognises is reported, not blocked: llama.cpp
then needs `--jinja`, which the Jinja path checks.
"""

from __future__ import annotations

from typing import Any, Protocol

from engine.blockers import Blocker
from engine.formats.gguf_structure import GGUFLayout
from engine.formats.source import SourceModel

SYSTEM = {"role": "system", "content": "You are a careful assistant. Answer briefly."}
CONVERSATIONS: tuple[tuple[str, tuple[dict[str, str], ...], bool], ...] = (
    ("question", (SYSTEM, {"role": "user", "content": "What is 2 + 2?"}), True),
    ("multi-turn", (SYSTEM, {"role": "user", "content": "Hello!"},
                    {"role": "assistant", "content": "Hi! How can I help?"},
                    {"role": "user", "content": "Name three colours, in French."}), True),
    ("answered", (SYSTEM, {"role": "user", "content": "Translate 'cat' to French."},
                  {"role": "assistant", "content": "chat"}), False),
)
PATHS = {"builtin": "llama.cpp's built-in template path (llama_chat_apply_template, BOS added by the GGUF's flag)",
         "jinja": "llama-cpp-python's Jinja formatter on the GGUF's template",
         "jinja_server": "the GGUF's template rendered as with llama-server --jinja (a leading BOS the template "
                         "writes dropped, then BOS added by the GGUF's flag)"}


class _Renderer(Protocol):
    def render_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool,
                    source_dir: Any) -> dict[str, Any]: ...

    def vocab_facts(self) -> dict[str, Any]: ...


def _first_difference(expected: list[int], actual: list[int]) -> int:
    return next((i for i, (a, b) in enumerate(zip(expected, actual, strict=False)) if a != b),
                min(len(expected), len(actual)))


def source_template(source: SourceModel) -> str | None:
    config = source.read_json("tokenizer_config.json") or {}
    template = config.get("chat_template")
    return template if isinstance(template, str) else source.read_text("chat_template.jinja")


def check_chat_template(source: SourceModel, layout: GGUFLayout, candidate: _Renderer,
                        details: dict[str, Any]) -> list[Blocker]:
    """Render every probe conversation on every path; blockers for ids unlike transformers' and double BOS."""
    if source_template(source) is None and "tokenizer.chat_template" not in layout.metadata:
        details["chat_template"] = {"checked": False, "why": "neither the source nor the GGUF has a chat template"}
        return []
    bos = candidate.vocab_facts()["bos"]
    found: list[Blocker] = []
    if "tokenizer.chat_template" not in layout.metadata:
        found.append(Blocker(code="chat.template_mismatch", gate="runtime", key="tokenizer.chat_template",
                             why="the source has a chat template and the GGUF has none: a runtime falls back to a "
                                 "default of its own"))
    rows: list[dict[str, Any]] = []
    for name, messages, generation_prompt in CONVERSATIONS:
        rendered = candidate.render_chat([dict(m) for m in messages], generation_prompt, source.root)
        hf = rendered["hf"]
        row: dict[str, Any] = {"conversation": name, "hf": hf.get("ids") or hf.get("error")}
        rows.append(row)
        if "ids" not in hf:
            row["skipped"] = "the source's own template refuses this conversation"
            continue
        for path, label in PATHS.items():
            result = rendered[path]
            if "ids" not in result:
                row[path] = result["error"]
                continue
            ids = result["ids"]
            row[path] = "equal" if ids == hf["ids"] else {"ids": ids, "first_difference":
                                                          _first_difference(hf["ids"], ids)}
            # two leading BOS that transformers gives too are the template's own (SmolLM2's BOS is <|im_start|>)
            if ids[:2] == [bos, bos] and hf["ids"][:2] != [bos, bos]:
                found.append(Blocker(code="chat.double_bos", gate="runtime", key="tokenizer.ggml.add_bos_token",
                                     why=f"{label}: conversation {name!r} starts with BOS ({bos}) twice: the "
                                         "template writes one and the runtime adds another"))
            elif ids != hf["ids"]:
                at = _first_difference(hf["ids"], ids)
                found.append(Blocker(code="chat.template_mismatch", gate="runtime", key="tokenizer.chat_template",
                                     why=f"{label}: conversation {name!r} gives other token ids than transformers' "
                                         f"apply_chat_template from position {at} ({ids[at:at + 4]} instead of "
                                         f"{hf['ids'][at:at + 4]})"))
    details["chat_template"] = {"checked": True, "paths": PATHS, "conversations": rows}
    return found
