"""CUDA graphs per batch bucket (`runtime.cuda_graphs: true`, GPU workers only).

A small batch on a GPU spends most of its time launching kernels one by one. A CUDA graph records
one forward pass's kernels once and replays them with a single launch. Shapes are fixed in a graph:
the handler pads every batch to a bucket (handlers/device.py), and the warm-up's pass over each
bucket captures it; after the warm-up (`seal`) nothing more is captured, and inputs of a shape
never captured (a text batch of another padded length, say) run the module as usual.

Replays write into the same output buffers, so the outputs are cloned before they are handed on:
post-processing of this batch may still be reading them when the next batch replays.
"""

from __future__ import annotations

from typing import Optional

import torch

from handlers import runtime

WARM_CALLS = 3  # before capture, on a side stream: lazy initialisation must not land in the graph


class GraphedBuckets:
    """`module(*tensors)` that replays a captured graph for input shapes it has seen."""

    def __init__(self, module, device: torch.device, autocast_dtype: Optional[torch.dtype]) -> None:
        self.module = module
        self.device = device
        self.autocast_dtype = autocast_dtype
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...], torch.Tensor]] = {}
        self.pool = None  # one memory pool for every bucket's graph
        self.sealed = False

    @staticmethod
    def key(tensors: tuple[torch.Tensor, ...]) -> tuple:
        return tuple((tuple(t.shape), t.dtype, t.stride()) for t in tensors)

    def __call__(self, *tensors: torch.Tensor):
        key = self.key(tensors)
        if key not in self.graphs:
            if self.sealed:
                return self.module(*tensors)
            self.graphs[key] = self._capture(tensors)
        graph, inputs, output = self.graphs[key]
        for buffer, tensor in zip(inputs, tensors):
            buffer.copy_(tensor, non_blocking=True)
        graph.replay()
        return output.clone()

    def _capture(self, tensors: tuple[torch.Tensor, ...]):
        inputs = tuple(t.clone() for t in tensors)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side), torch.inference_mode(), runtime.autocast(self.device, self.autocast_dtype):
            for _ in range(WARM_CALLS):
                self.module(*inputs)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool), torch.inference_mode(), \
                runtime.autocast(self.device, self.autocast_dtype):
            output = self.module(*inputs)
        self.pool = graph.pool()
        return graph, inputs, output

    def seal(self) -> None:
        """The warm-up is over: capture nothing more."""
        self.sealed = True

    def eval(self) -> GraphedBuckets:
        return self

    def parameters(self):
        return self.module.parameters()
