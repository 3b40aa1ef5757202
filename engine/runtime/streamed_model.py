"""Gate 2's Hugging Face reference in bounded memory: the model is built with its parameters on the
meta device and each module's weights are read from a checkpoint, cast to float32, just before the
module runs, then dropped right after it returns.

Why: `from_pretrained(dtype=float32)` holds the whole float32 model (4 bytes per parameter, plus a
private float32 copy of a BF16 source) beside llama.cpp's mapping, so a 7B model does not fit a pod.
Streamed, the peak is the process baseline plus the largest module's float32 weights (and the bytes
read for them) plus the activations of one text; what the model keeps between modules is only its
buffers (rotary `inv_freq`, position ids), built on the CPU as the model's constructor builds them.

Numerics are those of `from_pretrained` under transformers 5: the same class built from the same config
with weight initialisation off, and every checkpoint tensor brought into the model by transformers' own
loader (`convert_and_load_state_dict_in_model`, with the model's own conversion mapping: renamings such
as LayerNorm gamma/beta, and converters such as a mixture-of-experts layer's per-expert matrices fused
into one parameter), one module's keys at a time. A tied parameter (an output head tied to the input
embedding) reads what its tie source reads. The model reports the CPU as its device, as a whole CPU
model does (ModernBERT branches on it).

The checkpoint is pluggable (`Checkpoint`, engine/runtime/checkpoints.py): the source's safetensors, or
the artifact's own tensors dequantized with the converter's transforms undone
(`engine/runtime/artifact_weights.py`), so the same code gives gate 2 both of its references. A source
this cannot cover (a parameter no checkpoint key feeds, which transformers would initialise at random;
no safetensors at all) gets `None` and the caller loads the whole model instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from engine.runtime.checkpoints import Checkpoint, source_checkpoint

# A model whose float32 weights fit in this is kept once read (WeightStream); a larger one is streamed
# throughout. Every test fixture fits, so their gate 2 costs what it did. Part of the README's bound.
RESIDENT_BYTES = 1 << 30
STREAMED = "_convgate_streamed"  # set on a model whose weights are read for every forward pass (not kept)
HEAD_CHUNK_BYTES = 64 << 20  # a streamed output head is applied this many float32 bytes of its weight at a time
READ_AHEAD_MODULES = 2  # a module's pre-hook asks for the next ones' bytes (engine/runtime/read_ahead.py)


@contextlib.contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Parameters are created on the meta device (no memory), buffers where the constructor puts them."""
    import torch

    register = torch.nn.Module.register_parameter

    def on_meta(module: Any, name: str, parameter: Any) -> None:
        register(module, name, parameter)
        if parameter is not None:
            placed = module._parameters[name]
            module._parameters[name] = type(placed)(placed.to("meta"), requires_grad=placed.requires_grad)

    torch.nn.Module.register_parameter = on_meta  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register  # type: ignore[method-assign]


def build_on_meta(loader: Any, source_dir: Path) -> Any:
    """The class `loader.from_pretrained` would build, from the same config: parameters on the meta device,
    buffers computed on the CPU, no weight initialisation, ties made."""
    import torch
    from transformers import AutoConfig
    from transformers.initialization import no_init_weights
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # the loader draws a bar per call; it is called per module
    config = AutoConfig.from_pretrained(source_dir)
    with no_init_weights(), _parameters_on_meta():
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


class Loading:
    """transformers' own loader pointed at one checkpoint: which keys feed which model tensor, and the call
    that brings a handful of keys into the model (renamed and converted as from_pretrained does).

    Most tensors are one checkpoint key renamed: those are cast to float32 and set directly, which is what
    the loader does with them (`_materialize_copy` then `set_param_for_module`), without its per-call scan
    of the whole model (measured: 60% of a streamed forward). Tensors a converter builds from several keys
    (fused experts) go through the loader itself."""

    def __init__(self, model: Any, checkpoint: Checkpoint) -> None:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

        self.model = model
        self.checkpoint = checkpoint
        self.mapping = get_model_conversion_mapping(model)
        renamings = [m for m in self.mapping if isinstance(m, WeightRenaming)]
        converters = [m for m in self.mapping if isinstance(m, WeightConverter)]
        meta_state = model.state_dict()
        self.feeds: dict[str, list[str]] = {}  # model tensor name -> the checkpoint keys it is made of
        self.target: dict[str, str] = {}  # checkpoint key -> the model tensor it feeds
        self.converted: set[str] = set()  # model tensors a converter builds
        for key in checkpoint.names():
            target, pattern = rename_source_key(key, renamings, converters, model.base_model_prefix, meta_state)
            if target not in meta_state and key in meta_state:
                target, pattern = key, None
            self.feeds.setdefault(target, []).append(key)
            self.target[key] = target
            if pattern is not None:
                self.converted.add(target)
        self.buffers = {name for name, _ in model.named_buffers()}

    def load(self, keys: Sequence[str]) -> set[str]:
        """Bring `keys` into the model and return the model tensors they set; a tensor the model expects in
        another shape is an error, as in from_pretrained."""
        import torch
        from transformers.core_model_loading import convert_and_load_state_dict_in_model
        from transformers.modeling_utils import LoadStateDictConfig

        plain = [key for key in keys if self.target[key] not in self.converted]
        fused = [key for key in keys if self.target[key] in self.converted]
        for key, tensor in self.checkpoint.read(plain).items():
            name = self.target[key]
            owner, _, local = name.rpartition(".")
            module = self.model.get_submodule(owner)
            if name in self.buffers:
                module._buffers[local] = tensor
                continue
            expected = tuple(module._parameters[local].shape)
            if tuple(tensor.shape) != expected:
                raise ValueError(f"size mismatch for {key}: the checkpoint has {tuple(tensor.shape)}, the model "
                                 f"expects {expected}")
            module._parameters[local] = torch.nn.Parameter(tensor, requires_grad=False)
        if fused:
            config = LoadStateDictConfig(dtype=torch.float32, weight_mapping=self.mapping)  # type: ignore[arg-type]
            info, _ = convert_and_load_state_dict_in_model(self.model, self.checkpoint.read(fused), config)
            if info.mismatched_keys or info.conversion_errors:
                found = sorted(info.mismatched_keys) or sorted(info.conversion_errors)
                raise ValueError(f"size mismatch for {found[:3]}: the checkpoint's tensors do not fit the model")
        return {self.target[key] for key in keys}


def parameter_sources(model: Any, loading: Loading) -> dict[str, list[str]] | None:
    """Every parameter name (tied names included) -> the checkpoint keys it is read from; a tied parameter
    reads what its tie source reads. None when a parameter is fed by no checkpoint key."""
    tied = dict(getattr(model, "all_tied_weights_keys", {}) or {})
    sources: dict[str, list[str]] = {}
    for name, _ in model.named_parameters(remove_duplicate=False):
        keys = loading.feeds.get(name) or loading.feeds.get(tied.get(name, ""))
        if not keys:
            return None
        sources[name] = keys
    return sources


def check_shapes(loading: Loading, sources: dict[str, list[str]]) -> None:
    """Refuse a checkpoint whose tensor shapes differ from the model's, as `from_pretrained` does (streamed,
    the mismatch would otherwise surface mid-forward). Tensors made of several keys (fused experts) are
    checked by the loader when they are built."""
    for name, parameter in loading.model.named_parameters(remove_duplicate=False):
        keys = sources[name]
        if len(keys) == 1 and loading.feeds.get(name) == keys:
            found = loading.checkpoint.shape(keys[0])
            if found != tuple(parameter.shape):
                raise ValueError(f"size mismatch for {keys[0]}: the checkpoint has {found}, the model expects "
                                 f"{tuple(parameter.shape)}")


def load_persistent_buffers(loading: Loading) -> None:
    """Buffers saved in the checkpoint are loaded once and kept (they are small: position ids and the
    like); buffers absent from it keep the values the model computed at construction, as with
    `from_pretrained`."""
    loading.load(sorted({key for name, keys in loading.feeds.items() if name in loading.buffers for key in keys}))


def modules_with_parameters(model: Any) -> Iterator[tuple[str, Any]]:
    """Modules owning parameters directly (Linear, Embedding, norms, fused expert stacks): the units
    materialized one at a time, so the peak is one such module, never a whole block's worth at once."""
    for name, module in model.named_modules():
        if any(True for _ in module.parameters(recurse=False)):
            yield name, module


def _set(model: Any, name: str, parameter: Any) -> None:
    owner, _, local = name.rpartition(".")
    model.get_submodule(owner)._parameters[local] = parameter


class WeightStream:
    """Forward hooks that give a module its float32 weights just before it runs and put the meta
    placeholders back right after, so nothing but activations survives from one module to the next.

    Each pre-hook first asks for the next READ_AHEAD_MODULES modules' bytes (in the order the model
    registers its modules, which is nearly the order they run in), so the disk reads them while this one
    computes.

    With `keep`, weights stay once read: re-reading costs a page fault per 4 KiB for every text, which
    buys nothing on a model far smaller than the pod (every test fixture). It is all or nothing: kept
    modules interleaved with streamed ones would fragment the heap (measured: +150 MiB on 0.8 GB)."""

    def __init__(self, loading: Loading, sources: dict[str, list[str]], *, keep: bool) -> None:
        self.loading = loading
        self.sources = sources
        self.keep = keep
        self.resident: set[int] = set()
        self.placeholders = dict(loading.model.named_parameters(remove_duplicate=False))
        self.tied = dict(getattr(loading.model, "all_tied_weights_keys", {}) or {})
        self.gathered: set[int] = set()  # the input embedding read by rows: never read ahead whole

    def attach(self, model: Any) -> None:
        by_rows = {} if self.keep else self._read_by_rows(model)
        order = list(modules_with_parameters(model))
        names = [[f"{module_name}.{local}" if module_name else local for local, _ in module.named_parameters(
            recurse=False)] for module_name, module in order]
        keys = [[] if id(module) in self.gathered else self._keys(found)
                for (_, module), found in zip(order, names, strict=True)]
        for position, (_, module) in enumerate(order):
            ahead = [key for later in keys[position + 1:position + 1 + READ_AHEAD_MODULES] for key in later]
            if id(module) in by_rows:
                if ahead:
                    module.register_forward_pre_hook(lambda _module, _args, ahead=ahead: self._ask(ahead))
                by_rows[id(module)](module)
                continue
            module.register_forward_pre_hook(self._loader(names[position], keys[position], ahead))
            module.register_forward_hook(self._releaser())

    def _ask(self, keys: list[str]) -> None:
        self.loading.checkpoint.prefetch(keys)

    def _keys(self, names: list[str]) -> list[str]:
        """The checkpoint keys a module's parameters are read from."""
        return sorted({key for name in names for key in self.sources[name]})

    def _single_key(self, name: str) -> str | None:
        """The one checkpoint key a parameter is read from as it is stored (renamed at most), else None."""
        keys = self.sources.get(name, [])
        return keys[0] if len(keys) == 1 and self.loading.target[keys[0]] not in self.loading.converted else None

    def _read_by_rows(self, model: Any) -> dict[int, Any]:
        """The input embedding and the output head, read by rows instead of whole when streamed: the two
        largest modules of a decoder (vocabulary x hidden: 2.1 GB in float32 at 70B), neither of which needs
        all of its weight at once. The embedding reads only the rows of the tokens in the batch; the head is
        applied HEAD_CHUNK_BYTES of its weight at a time (the same products: a logit is one row's dot
        product, whichever other rows are computed beside it). Each gives the attach function for its module."""
        import torch

        names = {id(module): name for name, module in model.named_modules()}
        chosen: dict[int, Any] = {}
        with contextlib.suppress(NotImplementedError, AttributeError):
            embedding = model.get_input_embeddings()
            if isinstance(embedding, torch.nn.Embedding) and id(embedding) in names and \
                    (key := self._single_key(f"{names[id(embedding)]}.weight".lstrip("."))) is not None:
                chosen[id(embedding)] = lambda module, key=key: self._gather(module, key)
                self.gathered.add(id(embedding))
        with contextlib.suppress(NotImplementedError, AttributeError):
            head = model.get_output_embeddings()
            if type(head) is torch.nn.Linear and head.bias is None and id(head) in names and \
                    (key := self._single_key(f"{names[id(head)]}.weight".lstrip("."))) is not None:
                chosen[id(head)] = lambda module, key=key: self._chunk(module, key)
        return chosen

    def _gather(self, module: Any, key: str) -> None:
        """Before the embedding runs: its weight is the rows of the ids it is given, the ids renumbered into
        them (a gather reads the same values either way); after, the placeholder again."""
        import torch

        placeholder = module._parameters["weight"]
        padding = module.padding_idx  # only shapes gradients; a row number into the full table

        def gather(owner: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            ids = args[0] if args else kwargs["input"]
            unique, renumbered = torch.unique(ids, sorted=True, return_inverse=True)
            rows = self.loading.checkpoint.read_rows(key, unique.tolist())
            owner._parameters["weight"] = torch.nn.Parameter(rows, requires_grad=False)
            owner.padding_idx = None
            return ((renumbered, *args[1:]), kwargs) if args else (args, {**kwargs, "input": renumbered})

        def release(owner: Any, _args: Any, _output: Any) -> None:
            owner._parameters["weight"] = placeholder
            owner.padding_idx = padding

        module.register_forward_pre_hook(gather, with_kwargs=True)
        module.register_forward_hook(release)

    def _chunk(self, module: Any, key: str) -> None:
        """The head's forward, one slice of its rows (vocabulary entries) read and applied at a time."""
        import torch

        checkpoint, vocabulary = self.loading.checkpoint, module.out_features
        step = max(1, HEAD_CHUNK_BYTES // (4 * module.in_features))

        def forward(hidden: Any) -> Any:
            return torch.cat([torch.nn.functional.linear(hidden, checkpoint.read_rows(
                key, range(start, min(vocabulary, start + step)))) for start in range(0, vocabulary, step)], dim=-1)

        module.forward = forward

    def _loader(self, names: list[str], keys: list[str], ahead: list[str]) -> Any:
        """The pre-hook that reads a module's weights (its parameters `names`, read from checkpoint `keys`),
        after asking for the next modules' (`ahead`)."""
        def load(module: Any, _args: Any) -> None:
            if id(module) in self.resident:
                return
            if ahead:
                self._ask(ahead)
            loaded = self.loading.load(keys)
            model = self.loading.model
            for name in names:  # a tied parameter takes the tensor its tie source was just given
                if name not in loaded and name in self.tied:
                    _set(model, name, model.get_parameter(self.tied[name]))
                    loaded.add(name)
            module._convgate_loaded = loaded
            if self.keep:
                self.resident.add(id(module))
        return load

    def _releaser(self) -> Any:
        def release(module: Any, _args: Any, _output: Any) -> None:
            if id(module) in self.resident:
                return
            for name in getattr(module, "_convgate_loaded", ()):
                _set(self.loading.model, name, self.placeholders[name])
            module._convgate_loaded = set()
        return release


def streamed_model(loader: Any, source_dir: Path, resident_bytes: int | None = None,
                   checkpoint: Checkpoint | None = None) -> Any | None:
    """The model `loader.from_pretrained(source_dir, dtype=float32)` would give, with its weights streamed
    from `checkpoint` (default: the source's safetensors) module by module, or kept once read when all of
    it fits in `resident_bytes` (default RESIDENT_BYTES); None when the source cannot be streamed (see
    module docstring) and the caller should load it whole."""
    checkpoint = checkpoint or source_checkpoint(source_dir)
    if checkpoint is None:
        return None
    model = build_on_meta(loader, source_dir)
    loading = Loading(model, checkpoint)
    sources = parameter_sources(model, loading)
    if sources is None:
        return None
    check_shapes(loading, sources)
    load_persistent_buffers(loading)
    report_cpu_device(model)
    float32_bytes = 4 * sum(p.numel() for p in model.parameters())
    cap = RESIDENT_BYTES if resident_bytes is None else resident_bytes
    keep = float32_bytes <= cap
    WeightStream(loading, sources, keep=keep).attach(model)
    setattr(model, STREAMED, not keep)
    return model


def materialized_parameters(model: Any) -> int:
    """Parameters currently holding real memory (not meta): 0 between forwards when streaming works."""
    return sum(p.numel() for p in model.parameters() if p.device.type != "meta")
