"""What every fixture builder shares: pip downloads into the cache, the write-then-rename `produce`,
llama.cpp's vendored converter tree, its converter and quantizer, and the sentence-transformers
module files. Builders import it; it imports no builder, so the fixture scripts have no cycle."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path

# llama_ftype values from llama.h
QUANT_FTYPES = {"Q8_0": 7, "Q4_0": 2, "Q4_1": 3, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10, "Q3_K_M": 12, "Q4_K_S": 14,
                "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18, "IQ4_NL": 25, "IQ4_XS": 30}


def log(message: str) -> None:
    print(f"[fixtures] {message}", file=sys.stderr, flush=True)


def pip_download(spec: str, dest: Path, *extra: str) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    # a distribution's files are named `<name>-<version>...`: the dash keeps `pkg` from matching `pkg_part1`
    name = spec.split("==", maxsplit=1)[0].replace("-", "_").replace(".", "_").lower() + "-"
    found = [p for p in dest.iterdir() if p.name.lower().startswith(name)]
    if not found:
        subprocess.check_call(
            [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
             "-d", str(dest), *extra, spec]
        )
        found = [p for p in dest.iterdir() if p.name.lower().startswith(name)]
    return found[0]


def produce(target: Path, make: Callable[[Path], None]) -> Path:
    """Run `make(tmp)` and rename tmp to `target`, unless `target` already exists."""
    if target.exists():
        return target
    tmp = target.with_name(target.name + ".partial")
    if tmp.is_dir():
        shutil.rmtree(tmp)
    tmp.unlink(missing_ok=True)
    log(f"building {target.name}")
    make(tmp)
    tmp.rename(target)
    return target


LLAMA_CPP_FILES = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/", "models/ggml-vocab-", "src/llama-vocab.cpp")


def _extract_llama_cpp(cache: Path, version: str, wanted: tuple[str, ...], tmp: Path) -> None:
    sdist = pip_download(f"llama-cpp-python=={version}", cache / "downloads", "--no-binary", ":all:")
    prefix = f"llama_cpp_python-{version}/vendor/llama.cpp/"
    with tarfile.open(sdist) as archive:
        members = [m for m in archive.getmembers()
                   if m.name.startswith(prefix) and m.name[len(prefix):].startswith(wanted)]
        for member in members:
            member.name = member.name[len(prefix):]
        archive.extractall(tmp, members=members, filter="data")


def tiny_llama_variant(cache: Path, folder: str, write_weights: Callable[[Path, Path], None]) -> Path:
    """`<cache>/<folder>/source`: tiny-llama's tokenizer and configuration files beside weights of its own, which
    `write_weights(tiny_source, tmp)` writes (and the configuration, when it changes it)."""
    tiny = cache / "tiny-llama" / "source"
    (cache / folder).mkdir(exist_ok=True)

    def make_source(tmp: Path) -> None:
        tmp.mkdir()
        for path in tiny.iterdir():
            if path.suffix != ".safetensors":
                shutil.copyfile(path, tmp / path.name)
        write_weights(tiny, tmp)

    return produce(cache / folder / "source", make_source)


def llama_cpp_tree(cache: Path) -> Path:
    """The vendored llama.cpp tree of the installed llama-cpp-python version's sdist: the converter, gguf-py,
    the tokenizer test vocabularies and llama-vocab.cpp (the pre-tokenizer names it knows)."""
    version = metadata.version("llama-cpp-python")
    tree = produce(cache / f"llama.cpp-{version}",
                   lambda tmp: _extract_llama_cpp(cache, version, LLAMA_CPP_FILES, tmp))
    vocab_source = tree / "src" / "llama-vocab.cpp"
    if not vocab_source.exists():  # a tree extracted before this file was wanted
        vocab_source.parent.mkdir(exist_ok=True)
        produce(vocab_source.parent / "extracted",
                lambda tmp: _extract_llama_cpp(cache, version, ("src/llama-vocab.cpp",), tmp))
        (vocab_source.parent / "extracted" / "src" / "llama-vocab.cpp").rename(vocab_source)
    return tree


def extract_package_dir(wheel: Path, inner: str, target: Path) -> Path:
    def unpack(tmp: Path) -> None:
        with zipfile.ZipFile(wheel) as archive:
            for info in archive.infolist():
                if info.filename.startswith(inner) and not info.is_dir():
                    out = tmp / info.filename[len(inner):]
                    out.parent.mkdir(parents=True, exist_ok=True)
                    with archive.open(info) as src, out.open("wb") as dst:
                        shutil.copyfileobj(src, dst)

    return produce(target, unpack)


def convert(tree: Path, source: Path, outtype: str, target: Path) -> Path:
    def run(tmp: Path) -> None:
        env = dict(os.environ, PYTHONPATH=str(tree / "gguf-py"), NO_LOCAL_GGUF="")
        env.pop("NO_LOCAL_GGUF")
        subprocess.check_call(
            [sys.executable, str(tree / "convert_hf_to_gguf.py"), str(source), "--outfile", str(tmp),
             "--outtype", outtype],
            env=env, stdout=subprocess.DEVNULL,
        )

    return produce(target, run)


@contextlib.contextmanager
def quiet_native_stderr() -> Iterator[None]:
    """llama.cpp logs every tensor to fd 2; keep CI logs readable."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "wb") as devnull:
        os.dup2(devnull.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def quantize(base: Path, qtype: str, target: Path) -> Path:
    def run(tmp: Path) -> None:
        import llama_cpp

        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = QUANT_FTYPES[qtype]
        params.nthread = os.cpu_count() or 1
        with quiet_native_stderr():
            status = llama_cpp.llama_model_quantize(str(base).encode(), str(tmp).encode(), params)
        if status != 0:
            raise RuntimeError(f"llama_model_quantize failed for {qtype}")

    return produce(target, run)


def sentence_transformers_modules(root: Path, dim: int, pooling: dict[str, bool]) -> None:
    """modules.json (Transformer, Pooling, Normalize) and the Pooling module's config."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (root / "modules.json").write_text(json.dumps(modules, indent=2))
    (root / "1_Pooling").mkdir(exist_ok=True)
    (root / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": dim, **pooling}, indent=2))
