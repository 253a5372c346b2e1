"""A GPU worker's host-to-device copies (handlers/runtime.py to_device, handlers/pinned.py) under
tests/device_audit.py's virtual cuda:0: pinned buffers are reused across batches (grow-only, per
dtype and size bucket), never allocated per batch, a buffer still being sent is not written, and the
tensor arrives with its values and memory format."""

from __future__ import annotations

import pytest
import torch

from handlers import pinned, runtime
from tests.device_audit import virtual_cuda

pytestmark = pytest.mark.unit

CUDA = torch.device("cuda", 0)


@pytest.fixture()
def counted(monkeypatch):
    """A fresh pool for the worker, and a count of pinned allocations (Tensor.pin_memory calls)."""
    monkeypatch.setattr(pinned, "STAGING", pinned.PinnedBuffers())
    calls = []
    real = torch.Tensor.pin_memory

    def pin_memory(self, *args, **kwargs):
        calls.append(self.numel())
        return real(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
    return calls


def test_batches_reuse_the_workers_pinned_buffers(counted):
    with virtual_cuda() as audit:
        for step in range(10):
            ids = torch.arange(12).reshape(3, 4) + step
            mask = torch.ones(3, 4, dtype=torch.long)
            sent = [runtime.to_device(t, CUDA) for t in (ids, mask)]
            assert all(audit.marked(t) for t in sent)
            assert sent[0].cpu().tolist() == ids.tolist() and sent[1].cpu().tolist() == mask.tolist()
    # One buffer each for the two inputs of a batch, whatever the number of batches.
    assert len(counted) <= 2, f"pinned {len(counted)} times for 10 batches of 2 tensors"


def test_buffers_grow_only_and_keep_the_memory_format(counted):
    with virtual_cuda():
        small = torch.rand(2, 3, 8, 8).contiguous(memory_format=torch.channels_last)
        big = torch.rand(16, 3, 8, 8)
        for batch in (small, big, small, big, torch.rand(2, 3, 8, 8)):
            out = runtime.to_device(batch, CUDA)
            assert torch.equal(out.cpu(), batch) and out.stride() == batch.stride()
    assert len(counted) == 2, counted  # one per size bucket, reused from then on


def test_a_buffer_still_being_sent_is_not_written(counted):
    class InFlight:
        waited = 0

        def record(self, stream=None):
            pass

        def query(self):
            return False

        def synchronize(self):
            InFlight.waited += 1

    with virtual_cuda():
        virtual_event, torch.cuda.Event = torch.cuda.Event, InFlight  # every send still in flight
        try:
            for _ in range(pinned.PER_BUCKET + 2):
                runtime.to_device(torch.ones(4), CUDA)
        finally:
            torch.cuda.Event = virtual_event
    assert len(counted) == pinned.PER_BUCKET and InFlight.waited == 2
