"""Where a worker runs, and what running on a GPU asks of the handler.

- `place`: the device from TorchServe's gpu_id and the archive's `runtime.device`, with the reason;
  a GPU asked for and not usable is said loudly (a warning, the ready line, a metric), never only
  by a `device=cpu` in passing.
- `batch_buckets` / `pad_rows`: on a GPU, batches are padded to a few fixed sizes, so cudnn's
  autotuning, the warm-up and CUDA graphs see those shapes only.
- `retarget_device_constants`: a TorchScript graph traced on the CPU can hold `cpu` as a constant
  (transformers' mask code makes tensors on the input's device at trace time); they are moved to
  the serving device before the first call.
- `GpuTimer`: CUDA events around the forward, read once post-processing has synchronised anyway,
  so a stage's GPU time is counted where it belongs without a synchronisation of its own.
- `MemoryGuard`: a forward pass that runs out of GPU memory fails its own batch (507), never the
  worker; later batches run in smaller pieces. `warm_up` stops at the first size that does not fit.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import torch

from handlers.errors import ConfigError, OutOfMemory

log = logging.getLogger(__name__)

FALLBACK_METRIC = "WorkerDeviceFallback"  # 1 when a worker runs on the CPU although a GPU was meant


@dataclass(frozen=True)
class Placement:
    device: torch.device
    reason: str  # for the ready line
    fallback: bool = False  # a GPU was meant (a gpu_id, or runtime.device: gpu) and is not used


def place(gpu_id: Optional[int], wanted: str, cuda_available: Optional[Callable[[], bool]] = None) -> Placement:
    """TorchServe hands a gpu_id to a worker on a GPU host unless the archive says deviceType: cpu.
    `cuda_available`: default torch.cuda.is_available."""
    if wanted == "cpu":
        note = f"runtime.device: cpu (gpu_id {gpu_id} not used)" if gpu_id is not None else "runtime.device: cpu"
        return Placement(torch.device("cpu"), note)
    if gpu_id is None:
        if wanted == "gpu":
            return _fallback("runtime.device: gpu, but TorchServe gave this worker no gpu_id (a host without GPUs, "
                             "or number_of_gpu=0 in config.properties)")
        return Placement(torch.device("cpu"), "no gpu_id from TorchServe")
    if not (cuda_available or torch.cuda.is_available)():
        return _fallback(f"TorchServe gave this worker gpu_id {gpu_id}, but torch {torch.__version__} cannot use CUDA "
                         f"({'a CPU build' if torch.version.cuda is None else 'no usable driver or device'}): install "
                         "a CUDA build of torch (make venv TORCH=cuda), or build the archive with runtime.device: cpu")
    # The current device is what CUDA-graph capture, CUDA events, new streams and ONNX Runtime use
    # when no index is given; without this every worker would also open a context on GPU 0.
    torch.cuda.set_device(gpu_id)
    return Placement(torch.device("cuda", gpu_id), f"gpu_id {gpu_id}")


def _fallback(why: str) -> Placement:
    log.warning("RUNNING ON THE CPU: %s", why)
    return Placement(torch.device("cpu"), f"FALLBACK to cpu: {why}", fallback=True)


def emit_placement(metrics, model_name: str, placement: Placement) -> None:
    """WorkerDeviceFallback (0 or 1) through the engine's metrics sink (handlers/engines/), once per
    worker start."""
    if metrics is None:
        return
    metrics.gauge(FALLBACK_METRIC, 1 if placement.fallback else 0, "count", (("ModelName", model_name),
                                                                             ("Level", "Model")))


# ---- batch buckets --------------------------------------------------------------------------
def batch_buckets(max_batch_size: int) -> tuple[int, ...]:
    """Powers of two up to the maximum, and the maximum: the batch sizes warmed up (and, on a GPU,
    formed: a batch is padded up to the next one)."""
    top = max(1, max_batch_size)
    sizes = {1 << k for k in range(top.bit_length()) if 1 << k <= top}
    return tuple(sorted(sizes | {top}))


def bucket_for(rows: int, buckets: Sequence[int]) -> int:
    return next((b for b in buckets if b >= rows), rows)


def pad_rows(tensors: tuple[torch.Tensor, ...], rows: int) -> tuple[torch.Tensor, ...]:
    """Each batch-first tensor padded to `rows` by repeating its last row (a real input: no NaN, no
    division by a zero mask); the padding's outputs are dropped after the forward."""
    have = tensors[0].shape[0]
    if rows <= have:
        return tensors
    return tuple(torch.cat([t, t[-1:].expand(rows - have, *t.shape[1:])]) for t in tensors)


# ---- TorchScript device constants ------------------------------------------------------------
def _device_constants(graph) -> list:
    found = []
    for node in graph.nodes():
        if node.kind() == "prim::Constant" and node.output().type().kind() == "DeviceObjType":
            found.append(node)
        for block in node.blocks():
            found.extend(_device_constants(block))
    return found


def device_constants(module: torch.jit.ScriptModule) -> list[str]:
    """The device constants of every method of every submodule's graph."""
    return [node.s("value") for graph in _graphs(module) for node in _device_constants(graph)]


def retarget_device_constants(module: torch.jit.ScriptModule, device: torch.device) -> int:
    """Every device constant of the module's graphs set to `device`; returns how many changed.
    Must run before the module's first call (the executor keeps the plan it makes then)."""
    changed = 0
    for graph in _graphs(module):
        for node in _device_constants(graph):
            if node.s("value") != str(device):
                node.s_("value", str(device))
                changed += 1
    return changed


def _graphs(module: torch.jit.ScriptModule) -> list:
    graphs = []
    for sub in module.modules():
        for name in sub._c._method_names():
            graphs.append(sub._c._get_method(name).graph)
    return graphs


def load_torchscript(path: str, device: torch.device) -> torch.jit.ScriptModule:
    """An archive's TorchScript on the serving device, device constants included."""
    module = torch.jit.load(path, map_location=device).eval()
    if device.type != "cpu":
        moved = retarget_device_constants(module, device)
        if moved:
            log.info("moved %d device constant(s) of the TorchScript graph to %s", moved, device)
    return module


# ---- GPU timing and memory -------------------------------------------------------------------
class GpuTimer:
    """CUDA events around a forward pass; `elapsed_ms` is read after the outputs were copied to the
    host (which waited for the kernels), so reading it adds no synchronisation."""

    def __init__(self, device: torch.device) -> None:
        self.enabled = device.type == "cuda"
        self.start = torch.cuda.Event(enable_timing=True) if self.enabled else None
        self.end = torch.cuda.Event(enable_timing=True) if self.enabled else None

    def __enter__(self) -> GpuTimer:
        if self.enabled:
            self.start.record()
        return self

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self.end.record()

    def elapsed_ms(self) -> Optional[float]:
        return self.start.elapsed_time(self.end) if self.enabled else None


def nvml_errors() -> tuple[type[BaseException], ...]:
    """What NVML raises through torch.cuda.utilization: pynvml.NVMLError, not a RuntimeError. Read
    from the bindings torch has loaded (evaluated as the exception is matched, after torch's call):
    nvidia-ml-py is in the CUDA lock only."""
    error = getattr(sys.modules.get("pynvml"), "NVMLError", None)
    return (error,) if isinstance(error, type) else ()


class GpuGauges:
    """Per batch: allocated, reserved and peak allocated MiB on the device (the caching allocator's
    own counters: no synchronisation; the peak is the batch window's, reset after each read); at
    most once a second, the GPU's utilisation from NVML (nvidia-ml-py, in the CUDA lock; absent or
    refusing, the gauge is left out: reading the gauges never fails a batch)."""

    UTILISATION_EVERY_S = 1.0

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.read_at = float("-inf")
        self.utilisation: Optional[float] = None

    def read(self) -> dict[str, float]:
        if self.device.type != "cuda":
            return {}
        import time

        mib = 2.0 ** 20
        gauges = {"GPUMemoryAllocatedMiB": torch.cuda.memory_allocated(self.device) / mib,
                  "GPUMemoryReservedMiB": torch.cuda.memory_reserved(self.device) / mib,
                  "GPUMemoryPeakMiB": torch.cuda.max_memory_allocated(self.device) / mib}
        torch.cuda.reset_peak_memory_stats(self.device)  # the next read's peak is the next window's
        now = time.monotonic()
        if now - self.read_at >= self.UTILISATION_EVERY_S:
            self.read_at = now
            try:
                self.utilisation = float(torch.cuda.utilization(self.device))
            except (ModuleNotFoundError, RuntimeError, *nvml_errors()):  # no NVML, or it refused (a MIG slice)
                self.utilisation = None
        if self.utilisation is not None:
            gauges["GPUUtilizationPercent"] = self.utilisation
        return gauges


def check_onnx_provider(device: torch.device):
    """The ONNX Runtime execution provider for the device (on a GPU, with its device_id), or a
    ConfigError naming the fix."""
    if device.type == "cpu":
        return "CPUExecutionProvider"
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        return ("CUDAExecutionProvider", {"device_id": device.index or 0})
    raise ConfigError(f"runtime.graph: onnx on {device} needs ONNX Runtime's CUDA provider, and the installed "
                      f"onnxruntime has {onnxruntime.get_available_providers()}: install onnxruntime-gpu in place of "
                      "onnxruntime, or serve a torchscript or eager variant on the GPU (the build gives ONNX "
                      "archives deviceType: cpu unless runtime.device says gpu)")


# ---- running out of GPU memory ---------------------------------------------------------------
def out_of_memory(err: BaseException) -> bool:
    """A CUDA allocation that failed (torch's own error, or the RuntimeError older paths raise)."""
    return isinstance(err, torch.cuda.OutOfMemoryError) or (
        isinstance(err, RuntimeError) and "CUDA out of memory" in str(err))


class MemoryGuard:
    """`module(*tensors)` for a batch-first module on a GPU. A forward pass that runs out of memory
    raises OutOfMemory (its batch's 507: the caching allocator's free blocks are released, the worker
    lives) and halves `max_rows`; from then on a batch larger than `max_rows` runs in pieces of that
    many rows (the pieces' outputs concatenated), so the next batch is served at a size that fits."""

    def __init__(self, module, device: torch.device, max_rows: int) -> None:
        self.module = module
        self.device = device
        self.max_rows = max(1, max_rows)

    def __call__(self, *tensors: torch.Tensor):
        rows = tensors[0].shape[0]
        try:
            if rows <= self.max_rows:
                return self.module(*tensors)
            pieces = [self.module(*(t[start:start + self.max_rows] for t in tensors))
                      for start in range(0, rows, self.max_rows)]
            return torch.cat(pieces) if isinstance(pieces[0], torch.Tensor) else \
                type(pieces[0])(torch.cat(parts) for parts in zip(*pieces))
        except (torch.cuda.OutOfMemoryError, RuntimeError) as err:
            if not out_of_memory(err):
                raise
            self.max_rows = max(1, min(rows, self.max_rows) // 2)
            torch.cuda.empty_cache()
            log.warning("out of GPU memory on a batch of %d rows: it is answered 507; batches now run in pieces "
                        "of at most %d rows", rows, self.max_rows)
            raise OutOfMemory(f"the GPU ran out of memory on this batch of {rows}; later batches run in pieces "
                              f"of {self.max_rows} (retry)") from None

    def seal(self) -> None:
        if hasattr(self.module, "seal"):
            self.module.seal()

    def eval(self) -> MemoryGuard:
        return self

    def parameters(self):
        return self.module.parameters()


def warm_calls(graph: str, device: torch.device) -> int:
    """Forward passes per batch size in the warm-up: a TorchScript graph on CUDA specialises and
    compiles its fusions (NVRTC) on the second call of a shape, so it gets two; anything else one."""
    return 2 if graph == "torchscript" and device.type == "cuda" else 1


# The warm-up's time on shapes beyond each size's first: TorchServe gives a worker the archive's
# startupTimeout (60 s) for loading and warming up; what is left unwarmed compiles on its first request.
WARMUP_BUDGET_S = 30.0


def warm_up(forward: Callable[[Any], object], batch_sizes: Sequence[int], calls: int = 1,
            shapes: Optional[Callable[[int], Iterable[Any]]] = None, budget_s: float = WARMUP_BUDGET_S,
            clock: Callable[[], float] = time.monotonic) -> None:
    """`calls` forward passes per batch size, smallest first: `forward(size)`, or with `shapes`,
    `forward(batch)` for each batch `shapes(size)` gives (a text model's every padded length on a
    GPU, where each shape compiles its own graph). Each size's first shape always runs; past
    `budget_s` the rest are left (logged). A size that runs out of GPU memory ends the warm-up there
    (logged) instead of stopping the worker: MemoryGuard has already made later batches run in
    pieces that fit."""
    started, warmed = clock(), 0
    for size in sorted(batch_sizes):
        for index, item in enumerate(shapes(size) if shapes is not None else (size,)):
            if index and clock() - started > budget_s:
                log.warning("warm-up: %.0f s budget spent after %d shapes; batch %d's other shapes compile on their "
                            "first request", budget_s, warmed, size)
                break
            try:
                for _ in range(calls):
                    forward(item)
            except OutOfMemory as err:
                log.warning("warm-up stopped at batch %d: %s", size, err)
                return
            except (torch.cuda.OutOfMemoryError, RuntimeError) as err:
                if not out_of_memory(err):
                    raise
                torch.cuda.empty_cache()
                log.warning("warm-up stopped at batch %d: the GPU ran out of memory", size)
                return
            warmed += 1


KV_CACHE_SHARE = 0.7  # of the GPU memory free once the LM is loaded; the rest: activations, the prefix cache


def kv_cache_budget(device: Optional[torch.device]) -> int:
    """The LM engine's KV-cache budget in bytes (handlers/generation/engine.py): on a GPU, a share of
    the memory free when the worker starts (workers that start later on the same GPU see less free);
    elsewhere 0, no limit."""
    if device is None or torch.device(device).type != "cuda":
        return 0
    free, _ = torch.cuda.mem_get_info(device)
    return int(free * KV_CACHE_SHARE)
