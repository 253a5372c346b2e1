"""Model architectures that the handlers build around their weights (kept apart: a handler module
may define only one class, the one TorchServe instantiates)."""

from __future__ import annotations

from pathlib import Path

import torch


def build_encoder(config_path: Path, normalize: bool = True) -> torch.nn.Module:
    """BERT encoder + masked mean pooling (+ L2 norm unless normalize is off) as one traceable module."""
    from transformers import BertConfig, BertModel

    config = BertConfig.from_json_file(str(config_path))
    config._attn_implementation = "sdpa"
    return MeanPooledEncoder(BertModel(config, add_pooling_layer=False), normalize)


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor, normalize: bool = True) -> torch.Tensor:
    """sentence-transformers' pooling: the mean of the token vectors the mask keeps (padding
    excluded), in fp32, then L2-normalised when asked."""
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    pooled = ((hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)).float()
    return torch.nn.functional.normalize(pooled, p=2.0, dim=-1) if normalize else pooled


class MeanPooledEncoder(torch.nn.Module):
    def __init__(self, bert: torch.nn.Module, normalize: bool = True):
        super().__init__()
        self.bert = bert
        self.normalize = normalize

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask)[0]
        return mean_pool(hidden, attention_mask, self.normalize)
