"""Sentence embeddings from an encoder's token vectors: the head the text_embedder family puts
around any Hugging Face encoder (one traceable module, so TorchScript export takes it whole)."""

from __future__ import annotations

import torch


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor, normalize: bool = True) -> torch.Tensor:
    """sentence-transformers' pooling: the mean of the token vectors the mask keeps (padding
    excluded), in fp32, then L2-normalised when asked."""
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    pooled = ((hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)).float()
    return torch.nn.functional.normalize(pooled, p=2.0, dim=-1) if normalize else pooled


class PooledEncoder(torch.nn.Module):
    """encoder(input_ids, attention_mask) -> one vector per sequence: the masked mean of its token
    vectors, or the first token's ([CLS]); L2-normalised unless normalize is off."""

    def __init__(self, encoder: torch.nn.Module, pooling: str = "mean", normalize: bool = True):
        super().__init__()
        self.encoder = encoder
        self.cls = pooling == "cls"
        self.normalize = normalize

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask)[0]
        if not self.cls:
            return mean_pool(hidden, attention_mask, self.normalize)
        first = hidden[:, 0].float()
        return torch.nn.functional.normalize(first, p=2.0, dim=-1) if self.normalize else first
