"""Both generations of config.json are read as llama.cpp's converter reads them, by gate 1 and by the reference.

transformers 5 writes `rope_parameters` (per layer type where a model has both) and `num_local_experts`;
transformers 4 wrote `rope_theta`, `rope_local_base_freq`, `global_rope_theta` / `local_rope_theta` and
`num_experts`. For every architecture fixture, each generation's config (the 4.x ones written by transformers
4.57 itself: scripts/fixtures_configs.py) is converted by llama.cpp's own converter; gate 1 must then find
every key it derives equal to what the converter wrote (a Gemma-3 config written by 5.x was NO-GO with
`metadata.unexpected_key gemma3.rope.freq_base_swa`), and transformers 5, the reference, must read the same
rope bases and expert count from it (transformers 4 read a 5-written config with its defaults: rope base
10000, 128 experts).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine.formats.gguf_structure import read_layout
from tests.conftest import built, codes, fixtures_root, run_gate1

pytestmark = pytest.mark.slow
ARCHITECTURES = ("arch-llama", "arch-mistral", "arch-qwen2", "arch-qwen3moe", "arch-gemma2", "arch-gemma3",
                 "arch-phi3", "arch-modernbert")


def _source_with(config: Path, source: Path, out: Path) -> Path:
    """`source` with another config.json: the weights and tokenizer files linked, not copied."""
    out.mkdir()
    for item in source.iterdir():
        if item.name != "config.json":
            (out / item.name).symlink_to(item.resolve(), target_is_directory=item.is_dir())
    shutil.copyfile(config, out / "config.json")
    return out


def _convert(source: Path, target: Path) -> Path:
    tree = next(fixtures_root().glob("llama.cpp-*"))
    env = dict(os.environ, PYTHONPATH=str(tree / "gguf-py"))
    subprocess.run([sys.executable, str(tree / "convert_hf_to_gguf.py"), str(source), "--outfile", str(target),
                    "--outtype", "f16"], env=env, check=True, capture_output=True)
    return target


def _reference_reads(source: Path) -> dict[str, float | None]:
    """What transformers 5 builds the reference from: the global and sliding-window rope bases, the experts."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(source)
    rope = dict(getattr(config, "rope_parameters", None) or {})
    full, sliding = rope.get("full_attention", rope), rope.get("sliding_attention", {})
    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None)
    return {"freq_base": full.get("rope_theta"), "freq_base_swa": sliding.get("rope_theta"),
            "expert_count": float(experts) if experts else None}


def _converter_wrote(gguf: Path) -> dict[str, float | None]:
    metadata = read_layout(gguf).metadata
    arch = metadata["general.architecture"]
    return {"freq_base": metadata.get(f"{arch}.rope.freq_base"), "freq_base_swa": metadata.get(
        f"{arch}.rope.freq_base_swa"), "expert_count": float(metadata[f"{arch}.expert_count"])
        if f"{arch}.expert_count" in metadata else None}


@pytest.mark.parametrize("generation", ["transformers 4", "transformers 5"])
@pytest.mark.parametrize("folder", ARCHITECTURES)
def test_every_derived_key_and_the_reference_read_a_config_as_the_converter_does(folder, generation, tmp_path):
    fixture = built(folder, "Q8_0.gguf")
    config = (built("configs-v4", folder) / folder / "config.json" if generation == "transformers 4"
              else fixture / "source" / "config.json")
    source = _source_with(config, fixture / "source", tmp_path / "source")
    artifact = _convert(source, tmp_path / "F16.gguf")
    report = run_gate1(source, artifact)
    assert not {code for code in codes(report) if code.startswith("metadata.")}, report.blockers
    assert report.verdict == "GO", report.blockers
    wrote, reads = _converter_wrote(artifact), _reference_reads(source)
    for key in ("freq_base", "freq_base_swa", "expert_count"):  # what the GGUF says is what the reference runs
        if wrote[key] is None:
            assert reads[key] is None or key == "freq_base", (key, wrote, reads)  # llama.cpp's default base
        else:
            assert reads[key] is not None and float(reads[key]) == pytest.approx(wrote[key], rel=1e-6), (key, wrote,
                                                                                                        reads)
