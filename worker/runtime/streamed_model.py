"""Gate 2's Hugging Face reference in bounded memory: the model is built with its parameters on the
meta device and each module's weights are read from the memory-mapped safetensors, cast to float32,
just before the module runs, then dropped right after it returns.

Why: `from_pretrained(dtype=float32)` holds the whole float32 model (4 bytes per parameter, plus a
private float32 copy of a BF16 source) beside llama.cpp's mapping, so a 7B model does not fit a pod.
Streamed, the peak is the process baseline plus the largest module's float32 weights (and the source
bytes read for them) plus the activations of one text; what the model keeps between modules is only
its buffers (rotary `inv_freq`, position ids), built on the CPU exactly as `from_pretrained` builds them.

Numerics are those of `from_pretrained`: the same class built from the same config by the same
`init_empty_weights` context, the same key renaming (`_get_key_renaming_mapping`, which strips or adds
the base-model prefix and renames LayerNorm gamma/beta), the same tie rule (a tied parameter reads
the first name of its group the checkpoint holds, the input embedding), the same cast (a float32
tensor stays a view of the file's mapping, as from_pretrained leaves it), and the model reports the
CPU as its device, as a whole CPU model does (ModernBERT branches on it). A source
this cannot cover bit for bit (a parameter the checkpoint lacks, which transformers would initialise
at random; a non-safetensors checkpoint) gets `None` and the caller loads the whole model as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from worker.formats.json_input import parse_json

SINGLE_FILE = "model.safetensors"
SHARD_INDEX = "model.safetensors.index.json"
# A model whose float32 weights fit in this is kept once read (WeightStream); a larger one is streamed
# throughout. Every test fixture fits, so their gate 2 costs what it did. Part of the README's bound.
RESIDENT_BYTES = 256 * 2**20


def checkpoint_index(source_dir: Path) -> dict[str, Path] | None:
    """Checkpoint key -> the safetensors file holding it (one file or a sharded index); None when the
    source has no safetensors (transformers would then read a pickle, which cannot be streamed)."""
    from safetensors import safe_open

    index_file = source_dir / SHARD_INDEX
    if index_file.is_file():
        index = parse_json(index_file.read_bytes(), SHARD_INDEX)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict):
            return None  # not a shard list: left to from_pretrained's own checks
        names = {str(k): name for k, name in weight_map.items() if isinstance(name, str) and Path(name).name == name}
        return {key: source_dir / name for key, name in names.items()} if len(names) == len(weight_map) else None
    single = source_dir / SINGLE_FILE
    if not single.is_file():
        return None
    with safe_open(str(single), framework="pt") as handle:
        return dict.fromkeys(handle.keys(), single)


def build_on_meta(loader: Any, source_dir: Path) -> Any:
    """The class `loader.from_pretrained` would build, from the same config, under the same contexts:
    parameters on the meta device (no memory), buffers computed on the CPU, no weight initialisation."""
    import torch
    from transformers import AutoConfig
    from transformers.integrations.accelerate import init_empty_weights
    from transformers.modeling_utils import no_init_weights

    config = AutoConfig.from_pretrained(source_dir)
    with no_init_weights(), init_empty_weights(include_buffers=False):
        model = loader.from_config(config, dtype=torch.float32)
    model.tie_weights()
    return model.eval()


def report_cpu_device(model: Any) -> None:
    """Make every transformers model in the tree report the CPU as its device, as a whole model on the
    CPU does: `PreTrainedModel.device` reads the first parameter's device, which is meta here, and
    model code branches on it (ModernBERT's `_maybe_set_compile` would otherwise torch.compile its
    MLP, changing the numerics; other code would create tensors on the meta device)."""
    import torch
    from transformers import PreTrainedModel

    cpu = property(lambda _self: torch.device("cpu"))
    for module in model.modules():
        if isinstance(module, PreTrainedModel):
            cls = type(module)
            module.__class__ = type(cls.__name__, (cls,), {"device": cpu, "__module__": cls.__module__})


def renamed_keys(model: Any, checkpoint_keys: list[str]) -> dict[str, str]:
    """Model state-dict name -> checkpoint key, by transformers' own renaming (see module docstring)."""
    prefix = model.base_model_prefix
    has_prefix_module = bool(prefix) and any(key.startswith(prefix) for key in checkpoint_keys)
    expects_prefix_module = bool(prefix) and hasattr(model, prefix)
    mapping = model._get_key_renaming_mapping(
        checkpoint_keys, None,
        loading_base_model_from_task_state_dict=has_prefix_module and not expects_prefix_module,
        loading_task_model_from_base_state_dict=not has_prefix_module and expects_prefix_module)
    return {model_key: checkpoint_key for checkpoint_key, model_key in mapping.items()}


def parameter_sources(model: Any, available: dict[str, str]) -> dict[str, str] | None:
    """Every parameter name (tied names included) -> the checkpoint key it is read from; a tied group
    reads the first of its names the checkpoint holds, in module order (the input embedding), as
    `tie_weights` after loading leaves it. None when a parameter is in no checkpoint key."""
    groups: dict[int, list[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(parameter), []).append(name)
    sources: dict[str, str] = {}
    for names in groups.values():
        found = next((available[name] for name in names if name in available), None)
        if found is None:
            return None
        sources.update(dict.fromkeys(names, found))
    return sources


def read_tensors(files: dict[str, Path], keys: list[str]) -> dict[str, Any]:
    """The given checkpoint tensors, floating point ones cast to float32 as `from_pretrained(dtype=
    float32)` casts them (integer buffers keep their type). A float32 tensor stays a view of the file's
    private mapping, as from_pretrained leaves it (no copy; the same addresses' alignment); another
    dtype is cast into a new float32 tensor. Each file is opened for this read only: once the handle
    is closed the mapping lives only as long as the views, so the file-backed pages counted in the
    process RSS are released with the module's weights."""
    import torch
    from safetensors import safe_open

    out: dict[str, Any] = {}
    with ExitStack() as stack:
        handles: dict[Path, Any] = {}
        for key in keys:
            if files[key] not in handles:
                handles[files[key]] = stack.enter_context(safe_open(str(files[key]), framework="pt"))
            tensor = handles[files[key]].get_tensor(key)
            out[key] = tensor.to(torch.float32) if tensor.is_floating_point() else tensor
    return out


def check_shapes(model: Any, files: dict[str, Path], sources: dict[str, str]) -> None:
    """Refuse a checkpoint whose tensor shapes differ from the model's, as `from_pretrained` does
    (streamed, the mismatch would otherwise surface mid-forward as a shape error)."""
    from safetensors import safe_open

    expected = {sources[name]: tuple(p.shape) for name, p in model.named_parameters(remove_duplicate=False)}
    for path in sorted(set(files[key] for key in expected)):
        with safe_open(str(path), framework="pt") as handle:
            for key, shape in expected.items():
                if files[key] == path and tuple(handle.get_slice(key).get_shape()) != shape:
                    found = tuple(handle.get_slice(key).get_shape())
                    raise ValueError(f"size mismatch for {key}: the checkpoint has {found}, the model expects {shape}")


def load_persistent_buffers(model: Any, files: dict[str, Path], available: dict[str, str]) -> None:
    """Buffers saved in the checkpoint are loaded once and kept (they are small: position ids and the
    like); buffers absent from it keep the values the model computed at construction, as with
    `from_pretrained`."""
    parameters = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    wanted = {name: available[name] for name in model.state_dict(keep_vars=True)
              if name not in parameters and name in available}
    tensors = read_tensors(files, sorted(set(wanted.values())))
    for name, key in wanted.items():
        owner_name, _, local = name.rpartition(".")
        model.get_submodule(owner_name)._buffers[local] = tensors[key]


def modules_with_parameters(model: Any) -> Iterator[tuple[str, Any]]:
    """Modules owning parameters directly (Linear, Embedding, norms): the units materialized one at a
    time, so the peak is one such module, never a whole block's worth at once."""
    for name, module in model.named_modules():
        if any(True for _ in module.parameters(recurse=False)):
            yield name, module


class WeightStream:
    """Forward hooks that give a module its float32 weights just before it runs and put the meta
    placeholders back right after, so nothing but activations survives from one module to the next.

    With `keep`, weights stay once read: re-reading costs a page fault per 4 KiB for every text, which
    buys nothing on a model far smaller than the pod (every test fixture). It is all or nothing: kept
    modules interleaved with streamed ones would fragment the heap (measured: +150 MiB on 0.8 GB)."""

    def __init__(self, files: dict[str, Path], sources: dict[str, str], *, keep: bool) -> None:
        self.files = files
        self.sources = sources
        self.keep = keep
        self.resident: set[int] = set()

    def attach(self, model: Any) -> None:
        for module_name, module in modules_with_parameters(model):
            placeholders = dict(module.named_parameters(recurse=False))
            keys = {local: self.sources[f"{module_name}.{local}" if module_name else local] for local in placeholders}
            module.register_forward_pre_hook(self._loader(keys))
            module.register_forward_hook(self._releaser(placeholders))

    def _loader(self, keys: dict[str, str]) -> Any:
        def load(module: Any, _args: Any) -> None:
            import torch

            if id(module) in self.resident:
                return
            tensors = read_tensors(self.files, sorted(set(keys.values())))
            for local, key in keys.items():
                module._parameters[local] = torch.nn.Parameter(tensors[key], requires_grad=False)
            if self.keep:
                self.resident.add(id(module))
        return load

    def _releaser(self, placeholders: dict[str, Any]) -> Any:
        def release(module: Any, _args: Any, _output: Any) -> None:
            if id(module) not in self.resident:
                module._parameters.update(placeholders)
        return release


def streamed_model(loader: Any, source_dir: Path, resident_bytes: int | None = None) -> Any | None:
    """The model `loader.from_pretrained(source_dir, dtype=float32)` would give, with its weights
    streamed from the safetensors module by module, or kept once read when all of it fits in
    `resident_bytes` (default RESIDENT_BYTES); None when the source cannot be streamed bit for bit (see
    module docstring) and the caller should load it whole."""
    files = checkpoint_index(source_dir)
    if files is None:
        return None
    model = build_on_meta(loader, source_dir)
    available = renamed_keys(model, list(files))
    sources = parameter_sources(model, available)
    if sources is None:
        return None
    check_shapes(model, files, sources)
    load_persistent_buffers(model, files, available)
    report_cpu_device(model)
    float32_bytes = 4 * sum(p.numel() for p in model.parameters())
    cap = RESIDENT_BYTES if resident_bytes is None else resident_bytes
    WeightStream(files, sources, keep=float32_bytes <= cap).attach(model)
    return model


def materialized_parameters(model: Any) -> int:
    """Parameters currently holding real memory (not meta): 0 between forwards when streaming works."""
    return sum(p.numel() for p in model.parameters() if p.device.type != "meta")
