"""Print the requirement lines of pyproject.toml's core dependencies plus the named extras, one a line.

The Dockerfile installs an image's dependencies from pyproject.toml alone, before any source is copied, so
a source change reuses the layer that holds torch instead of reinstalling it. Self-references such as
`convgate[worker]` are expanded (they name the project, which is installed later without dependencies).

    python image_requirements.py PYPROJECT EXTRA [EXTRA ...]
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

PROJECT = "convgate"


def requirements(pyproject: Path, extras: list[str]) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    optional: dict[str, list[str]] = project.get("optional-dependencies", {})
    out: list[str] = []
    seen: set[str] = set()

    def add(lines: list[str]) -> None:
        for line in lines:
            self_ref = re.fullmatch(rf"{PROJECT}\[([\w,\s-]+)\]", line.strip())
            if self_ref:
                for extra in self_ref.group(1).split(","):
                    if extra.strip() not in seen:
                        seen.add(extra.strip())
                        add(optional[extra.strip()])
            elif line not in out:
                out.append(line)

    add(project["dependencies"])
    for extra in extras:
        if extra not in optional:
            raise SystemExit(f"image_requirements: pyproject.toml has no extra {extra!r}")
        seen.add(extra)
        add(optional[extra])
    return out


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    print("\n".join(requirements(Path(sys.argv[1]), sys.argv[2:])))
