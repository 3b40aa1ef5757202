"""Every blocker code the engine can raise is in the one table, and the table refuses strangers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from engine.blockers import BLOCKER_CODES, Blocker

ENGINE = Path(__file__).resolve().parents[2] / "engine"
CODE_LITERAL = re.compile(r'"((?:gguf|source|tensor|metadata|verifier|measurement|gate|artifact|tokenizer|embedding'
                          r'|imatrix|quality|runtime|chat|logits|rerank)'
                          r'\.(?!json"|chat_template"|datasets"|chunk_count"|chunk_size"|model")[a-z0-9_]+)"')


def test_every_code_used_in_the_engine_is_in_the_table():
    used = {match for path in ENGINE.rglob("*.py") if path.name != "blockers.py"
            for match in CODE_LITERAL.findall(path.read_text())}
    assert used, "the scan found no codes at all"
    assert used <= set(BLOCKER_CODES), used - set(BLOCKER_CODES)


def test_every_code_has_a_one_line_meaning():
    for code, meaning in BLOCKER_CODES.items():
        assert re.fullmatch(r"[a-z0-9]+\.[a-z0-9_]+", code)
        assert meaning and "\n" not in meaning


def test_unknown_code_is_refused():
    with pytest.raises(ValidationError):
        Blocker(code="tensor.looks_fine", gate="storage", why="")
