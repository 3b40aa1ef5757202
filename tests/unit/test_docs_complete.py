"""The docs name everything a user or an operator can set (issue 35: the README's CLI line lacked the
signature options and the settings were spread over four pages). Every `CONVGATE_*` setting, nested ones
included, is in docs/operations.md's tables; every option of every `convgate` command is in the README or
docs/."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer.main
from pydantic import BaseModel

from service.cli import app
from service.config import Settings

ROOT = Path(__file__).parents[2]
OPERATIONS = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
DOCS = "\n".join(path.read_text(encoding="utf-8") for path in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")])


def setting_names(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    for name, field in model.model_fields.items():
        kind = field.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            yield from setting_names(kind, prefix + name.upper() + "__")
        else:
            yield prefix + name.upper()


def options(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, str]]:
    """Every --flag of every command (typer builds them on its own copy of click: read by shape)."""
    if hasattr(command, "commands"):
        for name, sub in command.commands.items():
            yield from options(sub, (*path, name))
        return
    for parameter in command.params:
        if parameter.param_type_name == "option":
            for flag in parameter.opts:
                if flag.startswith("--"):
                    yield " ".join(path), flag


def test_every_setting_is_in_the_operations_settings_tables():
    names = list(setting_names(Settings))
    assert len(names) > 60
    missing = [name for name in names if f"`{name.rsplit('__', 1)[-1]}`" not in OPERATIONS]
    assert not missing, f"settings docs/operations.md does not list: {missing}"


def test_every_command_option_is_in_the_docs():
    found = list(options(typer.main.get_command(app)))
    assert ("verify", "--source-signature") in found and len(found) > 30
    missing = [(command, flag) for command, flag in found if flag not in DOCS]
    assert not missing, f"options no page names: {missing}"
