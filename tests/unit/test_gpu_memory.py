"""A worker on a GPU that runs out of memory (under tests/device_audit.py's virtual cuda:0): the batch
that ran out is answered 507, request by request, the worker lives, and the next batch of the same
size is served in pieces that fit; a warm-up size that does not fit ends the warm-up, not the worker."""

from __future__ import annotations

import json

import pytest
import torch

from handlers import device
from tests.device_audit import virtual_cuda
from tests.inprocess import make_handler

pytestmark = pytest.mark.unit

BODIES = [{"inputs": [[[float(v)] * 4] * 4]} for v in (1, 3, 5, 8)]  # parsed, as TorchServe hands JSON


class RoomFor(torch.nn.Module):
    """The served model on a device with room for `rows` rows at a time."""

    def __init__(self, model, rows: int) -> None:
        super().__init__()
        self.model, self.rows, self.seen = model, rows, []

    def forward(self, *tensors):
        self.seen.append(tensors[0].shape[0])
        if tensors[0].shape[0] > self.rows:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
        return self.model(*tensors)


def handle(handler, context):
    context.statuses = {}
    context.headers = {i: {"Content-Type": "application/json"} for i in range(len(BODIES))}
    answers = handler.handle([{"body": body} for body in BODIES], context)
    return answers, {idx: status for idx, (status, _) in context.statuses.items()}


def test_a_batch_out_of_gpu_memory_is_its_507_and_the_next_is_served_in_pieces(tiny_dirs):
    expected, _ = handle(*make_handler(tiny_dirs["tiny_tensor"], "tiny_tensor", batch_size=4))
    with virtual_cuda():
        handler, context = make_handler(tiny_dirs["tiny_tensor"], "tiny_tensor", batch_size=4, gpu_id=0)
        assert isinstance(handler.model, device.MemoryGuard)
        handler.model.module = tight = RoomFor(handler.model.module, 2)
        _, statuses = handle(handler, context)
        assert statuses == {0: 507, 1: 507, 2: 507, 3: 507}
        answers, statuses = handle(handler, context)  # the same worker, the same batch size
    assert statuses == {} and tight.seen == [4, 2, 2]
    assert [json.loads(a) for a in answers] == [json.loads(a) for a in expected]


def test_a_warm_up_out_of_gpu_memory_stops_there_and_the_worker_serves(tiny_dirs, monkeypatch):
    real = device.MemoryGuard

    def tight_guard(model, where, rows):
        return real(RoomFor(model, 2), where, rows)

    monkeypatch.setattr(device, "MemoryGuard", tight_guard)
    with virtual_cuda():
        handler, context = make_handler(tiny_dirs["tiny_tensor"], "tiny_tensor", batch_size=8, gpu_id=0,
                                        runtime={"warmup": True})
        assert handler.model.module.seen == [1, 2, 4] and handler.model.max_rows == 2
        _, statuses = handle(handler, context)
    assert statuses == {}
