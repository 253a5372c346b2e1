"""Run serving code as if it had a CUDA device, on a machine without one, and fail where a tensor
is made or left on the wrong side.

CI has no GPU, so a tensor created on the CPU next to a model on `cuda:0` (a mask, positions, a
sampling generator's draws) would only fail on a GPU host. Under `virtual_cuda()`:

- `torch.cuda.is_available()` is true; the device `cuda:0` is the CPU underneath, but every tensor
  placed there (a factory with `device=cuda...`, `.to("cuda")`, `.cuda()`, a module moved there,
  a TorchScript file loaded there) is marked as on the device, and so is every result computed
  from one;
- an operation that mixes a tensor on the device with one on the host (other than a 0-dim
  scalar, as CUDA allows) raises DeviceMix naming the operation, as CUDA would raise;
- a tensor on the device says so (`.device` is cuda:0, `.is_cuda` is true), so code that places
  new tensors `device=x.device` (transformers does) places them on the device too;
- `.cpu()`, `.tolist()`, `.item()` bring a tensor back to the host, as on a GPU; `.numpy()` of one
  on the device raises, as CUDA does.

Marks are kept per storage (views, `param.data = ...` and Parameters share them), and marked
tensors are kept alive until the context ends, so no storage address is reused meanwhile.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Optional

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

VIRTUAL = torch.device("cuda", 0)
# Operations real CUDA accepts across devices: copies, moves, and indexing with host indices.
CROSSING = {"copy_", "to", "cuda", "cpu", "pin_memory", "is_pinned", "__setitem__", "__getitem__", "index_put_",
            "tolist", "item", "__len__", "__repr__", "__format__", "__bool__", "__int__", "__float__", "__index__",
            "__get__", "size", "dim", "numel", "data_ptr", "untyped_storage", "element_size", "stride",
            "storage_offset", "is_contiguous", "requires_grad_", "detach", "_make_subclass",
            "_has_compatible_shallow_copy_type", "__set__"}
HOST_RESULT = {"cpu", "tolist", "item"}


class DeviceMix(RuntimeError):
    """Tensors on the device and on the host met in one operation (CUDA would refuse it)."""


def _is_virtual(value: Any) -> bool:
    if isinstance(value, torch.device):
        return value.type == "cuda"
    return isinstance(value, str) and value.split(":")[0] == "cuda"


def _host(value: Any) -> Any:
    if not _is_virtual(value):
        return value
    return "cpu" if isinstance(value, str) else torch.device("cpu")


class _Audit(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.on_device: set[int] = set()
        self.alive: list[torch.Tensor] = []  # marked storages stay allocated: no address is reused
        self.checked = 0

    def key(self, t: torch.Tensor) -> Optional[int]:
        """The tensor's storage address; None for one without data (torch.export's fake tensors)."""
        try:
            return t.untyped_storage().data_ptr()
        except RuntimeError:
            return None

    def marked(self, t: Any) -> bool:
        return isinstance(t, torch.Tensor) and t.numel() > 0 and self.key(t) in self.on_device

    def mark(self, t: Any) -> None:
        if isinstance(t, torch.Tensor) and t.numel() > 0 and t.device.type == "cpu" and self.key(t) is not None:
            self.on_device.add(self.key(t))
            self.alive.append(t)

    def mark_module(self, module: torch.nn.Module) -> None:
        for tensor in [*module.parameters(), *module.buffers()]:
            self.mark(tensor)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", str(func))
        owner = getattr(func, "__self__", None)
        if name == "__get__" and owner is torch.Tensor.device and self.marked(args[0]):
            return VIRTUAL
        if name == "__get__" and owner is torch.Tensor.is_cuda:
            return self.marked(args[0])
        if func is torch.device or name == "_parse_to":  # naming or parsing a device needs no CUDA
            with torch._C.DisableTorchFunction():
                return func(*args, **kwargs)
        if name == "numpy" and self.marked(args[0]):
            raise DeviceMix("numpy(): the tensor is on cuda:0 (CUDA refuses it: .cpu() first)")
        if name in ("pin_memory", "is_pinned"):  # no CUDA runtime to pin with: a host copy stands in
            with torch._C.DisableTorchFunction():
                return args[0].clone() if name == "pin_memory" else False
        flat, _ = tree_flatten((args, kwargs))
        to_device = any(_is_virtual(v) for v in flat) or name == "cuda"
        tensors = [v for v in flat if isinstance(v, torch.Tensor)]
        device_side = [t for t in tensors if self.marked(t)]
        host_side = [t for t in tensors if not self.marked(t) and t.dim() > 0 and t.numel() > 0]
        generators = [v for v in flat if isinstance(v, torch.Generator)]
        if name not in CROSSING:
            self.checked += 1
            if device_side and host_side:
                shapes = ", ".join(f"{tuple(t.shape)} {'cuda' if self.marked(t) else 'cpu'}" for t in tensors)
                raise DeviceMix(f"{name}: tensors on cuda:0 and on the cpu in one operation ({shapes})")
            if device_side and any(g.device.type == "cpu" for g in generators):
                raise DeviceMix(f"{name}: a cpu torch.Generator draws for tensors on cuda:0")
        args, kwargs = tree_map(_host, (args, kwargs))
        if name == "cuda":
            func, args = torch.Tensor.to, (args[0], "cpu")
        with torch._C.DisableTorchFunction():
            result = func(*args, **kwargs)
        if name in HOST_RESULT or (name == "to" and not to_device and any(str(v).startswith("cpu") for v in flat
                                                                           if not isinstance(v, torch.Tensor))):
            return result.clone() if isinstance(result, torch.Tensor) and self.marked(result) else result
        if name in ("to", "cuda") and to_device:
            source = args[0] if args and isinstance(args[0], torch.Tensor) else None
            if isinstance(result, torch.Tensor) and result is source and not self.marked(result):
                with torch._C.DisableTorchFunction():
                    result = result.clone()  # a move: the host tensor stays on the host
            self.mark(result)
            return result
        if to_device or device_side:
            for out in tree_flatten(result)[0]:
                self.mark(out)
        return result


class _FakeEvent:
    """torch.cuda.Event without a GPU: elapsed_time from the wall clock between two records."""

    def __init__(self, enable_timing: bool = False, **_: Any) -> None:
        self.at = None

    def record(self, stream: Any = None) -> None:
        import time

        self.at = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: _FakeEvent) -> float:
        return 1000.0 * (end.at - self.at)


@contextlib.contextmanager
def virtual_cuda() -> Iterator[_Audit]:
    """The context above; yields the audit (its `mark_module` marks a model made outside it)."""
    audit = _Audit()
    real_jit_load = torch.jit.load

    def jit_load(f, map_location=None, **kwargs):
        module = real_jit_load(f, map_location=_host(map_location), **kwargs)
        if _is_virtual(map_location):
            audit.mark_module(module)
        return module

    patches = {
        (torch.cuda, "is_available"): lambda: True,
        (torch.cuda, "device_count"): lambda: 1,
        (torch.cuda, "is_bf16_supported"): lambda *a, **k: True,
        (torch.cuda, "synchronize"): lambda *a, **k: None,
        (torch.cuda, "set_device"): lambda *a, **k: None,
        (torch.cuda, "current_device"): lambda: 0,
        (torch.cuda, "get_device_name"): lambda *a, **k: "virtual cuda (device_audit)",
        (torch.cuda, "memory_allocated"): lambda *a, **k: 0,
        (torch.cuda, "max_memory_allocated"): lambda *a, **k: 0,
        (torch.cuda, "memory_reserved"): lambda *a, **k: 0,
        (torch.cuda, "reset_peak_memory_stats"): lambda *a, **k: None,
        (torch.cuda, "mem_get_info"): lambda *a, **k: (0, 0),
        (torch.cuda, "utilization"): lambda *a, **k: 0,
        (torch.cuda, "Event"): _FakeEvent,
        (torch.jit, "load"): jit_load,
    }
    saved = {key: getattr(*key, None) for key in patches}
    for (owner, name), value in patches.items():
        setattr(owner, name, value)
    try:
        with audit:
            yield audit
    finally:
        for (owner, name), value in saved.items():
            if value is None:
                delattr(owner, name)
            else:
                setattr(owner, name, value)
        audit.alive.clear()
