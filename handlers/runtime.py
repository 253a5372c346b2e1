"""Runtime optimisations: each a small function with one job, called from the base handler."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import psutil
import torch

from handlers.errors import ConfigError
from handlers.settings import RuntimeSettings

log = logging.getLogger(__name__)

_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def usable_cores() -> int:
    """Physical cores this process may run on (affinity and SMT taken into account)."""
    physical = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    return max(1, min(physical, len(os.sched_getaffinity(0))))


def sibling_worker_count() -> int:
    """How many TorchServe workers serve this model, counting this one.

    The frontend starts a model's workers together and each runs in the model's extracted
    directory, so siblings are the frontend's python children sharing our working directory.
    """
    me = psutil.Process()
    try:
        cwd = me.cwd()
        siblings = [p for p in me.parent().children() if p.pid != me.pid and _is_worker_in(p, cwd)]
    except (psutil.Error, AttributeError):  # no parent (unit tests) or a sibling vanished
        return 1
    return 1 + len(siblings)


def _is_worker_in(process: psutil.Process, cwd: str) -> bool:
    try:
        return process.cwd() == cwd and any("model_service_worker" in part for part in process.cmdline())
    except psutil.Error:
        return False


def thread_budget(settings: RuntimeSettings, planned: Optional[int], workers: Optional[int], cores: int) -> tuple[int, str]:
    """Intra-op threads per worker and where the number came from: the archive's setting, the
    server's written plan (handlers/plan.py: it counts every model on the cores), or, with neither,
    the cores shared among all the server's workers. `workers` is None where that count is unknown:
    one thread then, since more could oversubscribe the cores."""
    if settings.threads is not None:
        return settings.threads, "runtime.threads"
    if planned is not None:
        return planned, "plan"
    if workers is None:
        return 1, "no plan, worker count unknown"
    return max(1, cores // max(1, workers)), f"{cores} cores / {workers} workers (no plan)"


def apply_threads(intra_op: int, inter_op: int) -> None:
    torch.set_num_threads(intra_op)
    try:
        torch.set_num_interop_threads(inter_op)
    except RuntimeError:  # only settable once per process, before inter-op work starts
        log.info("inter-op threads already fixed at %d", torch.get_num_interop_threads())


def resolve_precision(requested: str, device: torch.device) -> Optional[torch.dtype]:
    """The autocast dtype to use, or None for fp32; falls back (logged) where the device lacks support."""
    if requested not in _DTYPES:
        raise ConfigError(f"runtime.precision: unknown precision {requested!r}")
    dtype = _DTYPES[requested]
    if dtype is None:
        return None
    if device.type == "cuda":
        if dtype is torch.bfloat16 and not torch.cuda.is_bf16_supported():
            log.warning("bf16 not supported on %s: falling back to fp16", device)
            return torch.float16
        return dtype
    if not cpu_supports(dtype):
        log.warning("%s autocast not supported by this CPU: falling back to fp32", requested)
        return None
    return dtype


# The instructions that run a reduced precision natively. oneDNN also runs bf16 on plain AVX-512,
# converting in software, and slower than fp32 (docs/optimisations.md#precision).
_NATIVE = {torch.bfloat16: ("avx512_bf16", "amx_bf16"), torch.float16: ("avx512_fp16", "amx_fp16")}


def cpu_supports(dtype: torch.dtype) -> bool:
    """Whether this CPU runs the reduced precision natively (bf16: AVX-512 BF16 or AMX; fp16:
    AVX-512 FP16 or AMX), not only by oneDNN's conversions."""
    capabilities = torch.cpu.get_capabilities()
    return any(capabilities.get(name, False) for name in _NATIVE[dtype])


def autocast(device: torch.device, dtype: Optional[torch.dtype]):
    """The autocast context for a forward pass; a no-op context in fp32."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def configure_cuda(settings: RuntimeSettings, device: torch.device) -> None:
    if device.type != "cuda":
        return
    torch.backends.cudnn.benchmark = settings.cudnn_benchmark
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True


def prepare_eager(model: torch.nn.Module, device: torch.device, channels_last: bool) -> torch.nn.Module:
    model = model.eval().to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model


def compile_model(model: torch.nn.Module, mode: str) -> Callable:
    """torch.compile is lazy: the first calls (made during warm-up) do the compiling."""
    return torch.compile(model, mode=mode, dynamic=False)


def memory_format(batch: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """Image batches (4-D) in the layout the model was prepared for; a no-op when already so."""
    if batch.dim() != 4:
        return batch
    return batch.contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)


def to_device(batch: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host -> device copy; on CUDA from the worker's reusable pinned buffers (handlers/pinned.py), so
    the copy overlaps with the launch and no batch allocates pinned memory."""
    if device.type != "cuda":
        return batch
    from handlers.pinned import STAGING  # GPU workers only

    return STAGING.to_device(batch, device)


def decode_pool(threads: int) -> Optional[ThreadPoolExecutor]:
    """Threads for per-request decoding; None (decode inline) when only one is wanted."""
    return ThreadPoolExecutor(max_workers=threads, thread_name_prefix="decode") if threads > 1 else None


def warm_up(forward: Callable[[int], object], batch_sizes: Sequence[int]) -> None:
    """One forward pass per batch size the server will form (handlers/device.py's buckets), so no real
    request pays for first-call setup (oneDNN primitives, cudnn's autotuning, CUDA graph capture)."""
    for batch_size in batch_sizes:
        forward(batch_size)


def freeze_heap() -> int:
    """Move every object alive after start-up into the collector's permanent generation.

    A full collection otherwise walks everything torch, the tokenizer and the model left behind
    (over a hundred thousand objects), a stall for every request of the batch in flight
    (docs/results.md, "Smaller measurements"). Returns how many objects were frozen.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class _PerBatchNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Backend received inference at")


def drop_per_batch_log_line() -> None:
    """TorchServe's worker logs "Backend received inference at: <time>" for every batch (root
    logger, INFO), and the frontend copies each line into model_log: a line per batch that says
    nothing /metrics does not. Filtered on the worker's log handlers; everything else stays."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, _PerBatchNotice) for f in handler.filters):
            handler.addFilter(_PerBatchNotice())


def precision_label(rt, autocast_dtype) -> str:
    """The precision a worker runs in, for its ready line (`rt`: the archive's runtime settings)."""
    if rt.graph == "torchscript":
        return f"{rt.precision} (traced into the TorchScript graph)"
    if rt.graph == "onnx":
        return f"{rt.precision} (as exported into the ONNX graph)"
    if rt.graph == "aoti":
        return f"{rt.precision} (compiled into the AOTInductor package)"
    if rt.precision != "fp32" and autocast_dtype is None:
        return f"fp32 ({rt.precision} unsupported here)"
    return rt.precision


def session_label(model) -> str:
    """ONNX Runtime's intra-op threads as the session reports them, for the ready line ("" otherwise)."""
    threads = getattr(model, "intra_op_threads", None)
    return "" if threads is None else f" onnxruntime_intra_op_threads={threads} (read back from the session)"
