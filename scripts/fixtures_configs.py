"""config.json as transformers 4 writes it, for every architecture fixture the sources of are written by 5.

Why: both generations of config are in the wild. transformers 5 writes one `rope_parameters` dict (per layer
type where a model has both) and `num_local_experts`; transformers 4 wrote `rope_theta`, `rope_scaling`,
`rope_local_base_freq`, `global_rope_theta` / `local_rope_theta` and `num_experts`. The suite checks that
gate 1 derives every key from either as llama.cpp's converter does, and that the reference (transformers 5)
reads a 4-written config to the same model (tests/integration/test_config_generations.py).

The 4.x configs are written by transformers 4.57 itself, in a venv of its own under the fixtures folder
(configs need no torch), from the same constructor arguments the fixture builders pass to 5.x.
"""

from __future__ import annotations

import json
import os
import subprocess
import venv
from pathlib import Path

from fixture_tools import log, produce

TRANSFORMERS_4 = "transformers==4.57.6"
WRITER = """
import json, sys, transformers
for target, class_name, kwargs in json.loads(sys.stdin.read()):
    getattr(transformers, class_name)(**kwargs).to_json_file(target, use_diff=True)
"""


def _constructor_args(cache: Path) -> dict[str, tuple[str, dict]]:
    """Fixture folder -> (config class, the arguments its builder gives transformers)."""
    from fixtures_decoders import FIXTURES
    from fixtures_modernbert import TINY_MODERNBERT_CONFIG

    out: dict[str, tuple[str, dict]] = {}
    for spec in FIXTURES.values():
        built = json.loads((cache / spec.folder / "source" / "config.json").read_text())
        ids = {k: built.get(k) for k in ("vocab_size", "bos_token_id", "eos_token_id", "pad_token_id")}
        out[spec.folder] = (spec.config_class, {**ids, **spec.config, **spec.extra,
                                                "architectures": built["architectures"]})
    built = json.loads((cache / "arch-modernbert" / "source" / "config.json").read_text())
    out["arch-modernbert"] = ("ModernBertConfig", {"architectures": ["ModernBertModel"], "initializer_range": 0.2,
                                                   **TINY_MODERNBERT_CONFIG,
                                                   **{k: built[k] for k in ("vocab_size",) if k in built}})
    return out


def build_configs_v4(cache: Path) -> None:
    def make(tmp: Path) -> None:
        env_dir = cache / "transformers4-venv"
        python = env_dir / "bin" / "python"
        if not python.exists():
            venv.EnvBuilder(with_pip=True).create(env_dir)
        subprocess.check_call([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                               TRANSFORMERS_4])
        jobs = []
        for folder, (class_name, kwargs) in _constructor_args(cache).items():
            (tmp / folder).mkdir(parents=True)
            jobs.append((str(tmp / folder / "config.json"), class_name, kwargs))
        log(f"writing {len(jobs)} configs with {TRANSFORMERS_4}")
        subprocess.run([str(python), "-c", WRITER], input=json.dumps(jobs), text=True, check=True,
                       env=dict(os.environ, TRANSFORMERS_NO_ADVISORY_WARNINGS="1"))

    produce(cache / "configs-v4", make)
