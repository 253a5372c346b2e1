"""The keys and values of every running sequence, as one batch the model extends a step at a time.

Rows are sequences; the time axis is left-padded, so each row's real tokens end at the last
column and one decoding step appends one column for all rows at once. `mask` marks real
positions (1) and padding (0); a row's next position is its count of real tokens. A row is
dropped the moment its sequence ends, and columns that have become padding in every row are cut,
so the cache only ever holds what the running sequences need.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import torch

Layer = tuple[torch.Tensor, torch.Tensor]  # keys, values: (rows, heads, time, head_dim)


class KVBatch:
    def __init__(self, layers: list[Layer], mask: torch.Tensor) -> None:
        self.layers = layers
        self.mask = mask  # (rows, time), int64

    @property
    def rows(self) -> int:
        return int(self.mask.shape[0])

    @property
    def nbytes(self) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.layers)

    def positions(self) -> torch.Tensor:
        """(rows, 1): the position of each row's next token."""
        return self.mask.sum(dim=1, keepdim=True)

    @classmethod
    def from_prefill(cls, layers: Sequence[Layer], mask: torch.Tensor) -> KVBatch:
        """Padding positions zeroed: masked out of attention, they must not carry NaN or inf either
        (set, not multiplied: NaN x 0 is NaN)."""
        padding = mask[:, None, :, None] == 0
        return cls([(k.masked_fill(padding, 0.0), v.masked_fill(padding, 0.0)) for k, v in layers], mask)

    def extended(self, layers: Sequence[Layer]) -> KVBatch:
        """After a decoding step: the model's layers (one column longer), every row real there."""
        ones = torch.ones((self.rows, 1), dtype=self.mask.dtype, device=self.mask.device)
        return KVBatch(list(layers), torch.cat([self.mask, ones], dim=1))

    def merged(self, other: Optional[KVBatch]) -> KVBatch:
        """`other`'s rows after ours, the shorter side padded on the left."""
        if other is None or other.rows == 0:
            return self
        if self.rows == 0:
            return other
        width = max(self.mask.shape[1], other.mask.shape[1])
        mine, theirs = self._padded_to(width), other._padded_to(width)
        layers = [(torch.cat([a[0], b[0]]), torch.cat([a[1], b[1]])) for a, b in zip(mine.layers, theirs.layers)]
        return KVBatch(layers, torch.cat([mine.mask, theirs.mask]))

    def _padded_to(self, width: int) -> KVBatch:
        extra = width - self.mask.shape[1]
        if extra == 0:
            return self
        layers = []
        for k, v in self.layers:
            pad = k.new_zeros((k.shape[0], k.shape[1], extra, k.shape[3]))
            layers.append((torch.cat([pad, k], dim=2), torch.cat([pad, v], dim=2)))
        return KVBatch(layers, torch.cat([self.mask.new_zeros((self.rows, extra)), self.mask], dim=1))

    def kept(self, rows: Sequence[int]) -> KVBatch:
        """Only these rows (in this order), with columns that are padding in all of them cut."""
        index = torch.tensor(list(rows), dtype=torch.long, device=self.mask.device)
        mask = self.mask.index_select(0, index)
        if len(rows) == 0:
            return KVBatch([(k[:0, :, :0], v[:0, :, :0]) for k, v in self.layers], mask[:, :0])
        start = int(mask.any(dim=0).nonzero()[0])
        return KVBatch([(k.index_select(0, index)[:, :, start:], v.index_select(0, index)[:, :, start:])
                        for k, v in self.layers], mask[:, start:])
