"""Host-to-GPU copies through reusable pinned buffers.

A copy from pageable memory makes CUDA stage it through a pinned buffer of its own and blocks the
host until it is done; `tensor.pin_memory()` per batch avoids that but allocates (cudaHostAlloc, slow
and serialising) and frees a pinned block every batch. The worker keeps its own pinned buffers
instead, grow-only, keyed by dtype and size bucket (the next power of two of the bytes), a few per
bucket: a batch's tensor is copied into a free one and sent with `non_blocking=True`; a CUDA event
recorded after the send says when the buffer may be written again. Only GPU workers use it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

PER_BUCKET = 4  # buffers of one bucket in flight at once (a batch's inputs); past that, wait for the oldest


@dataclass
class _Buffer:
    storage: torch.Tensor  # 1-D, pinned
    sent: Any = None  # the CUDA event recorded after its last send; None: never sent


@dataclass
class PinnedBuffers:
    """One worker's pinned buffers (a TorchServe worker is one process: `STAGING` below)."""

    buckets: dict[tuple[torch.dtype, int], list[_Buffer]] = field(default_factory=dict)
    allocations: int = 0  # pinned allocations made (a test and the curious read it)

    def to_device(self, batch: torch.Tensor, device: torch.device) -> torch.Tensor:
        """`batch` on `device`, its strides (memory format) kept, sent from a pinned buffer."""
        if not (batch.is_contiguous() or batch.is_contiguous(memory_format=torch.channels_last)):
            batch = batch.contiguous()
        buffer = self._free(batch.dtype, batch.numel())
        view = buffer.storage[:batch.numel()].as_strided(batch.shape, batch.stride())
        view.copy_(batch)
        out = view.to(device, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        buffer.sent = event
        return out

    def _free(self, dtype: torch.dtype, numel: int) -> _Buffer:
        size = 1 << max(0, (numel * dtype.itemsize - 1).bit_length())  # the bucket: bytes, next power of two
        bucket = self.buckets.setdefault((dtype, size), [])
        chosen = next((b for b in bucket if b.sent is None or b.sent.query()), None)
        if chosen is None and len(bucket) >= PER_BUCKET:
            chosen = bucket.pop(0)  # the oldest send: wait for it, then reuse its buffer
            chosen.sent.synchronize()
            bucket.append(chosen)
        if chosen is None:
            storage = torch.empty(max(1, size // dtype.itemsize), dtype=dtype).pin_memory()
            self.allocations += 1
            chosen = _Buffer(storage)
            bucket.append(chosen)
        return chosen


STAGING = PinnedBuffers()  # this worker's; empty until its first GPU batch
