"""Which dimensions of a family's model inputs vary between requests, for the torch.export-based
exports (AOTInductor, ONNX): the batch of every input, and the sequence of 2-D integer inputs (token
ids and masks); every other dimension (an image's channels and size) stays the example's."""

from __future__ import annotations

import torch

BATCH = "batch"
SEQUENCE = "sequence"
# The longest token sequence a package takes: a model with learned positions (BERT's 512) fixes the
# sequence's range, and torch.export refuses an unbounded dimension there ("Constraints violated").
MAX_SEQUENCE = 512


def dynamic_shapes(example: tuple[torch.Tensor, ...]) -> tuple[dict[int, torch.export.Dim], ...]:
    """Per input: batch (dim 0) dynamic; for 2-D integer inputs, the sequence (dim 1) too."""
    batch, sequence = torch.export.Dim(BATCH, min=1), torch.export.Dim(SEQUENCE, min=1, max=MAX_SEQUENCE)
    return tuple({0: batch, 1: sequence} if not t.is_floating_point() and t.dim() == 2 else {0: batch}
                 for t in example)
