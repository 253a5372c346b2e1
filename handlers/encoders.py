"""Model architectures that the handlers build around their weights (kept apart: a handler module
may define only one class, the one TorchServe instantiates)."""

from __future__ import annotations

from pathlib import Path

import torch


def build_encoder(config_path: Path) -> torch.nn.Module:
    """BERT encoder + masked mean pooling (+ L2 norm) as one traceable module."""
    from transformers import BertConfig, BertModel

    config = BertConfig.from_json_file(str(config_path))
    config._attn_implementation = "sdpa"
    return MeanPooledEncoder(BertModel(config, add_pooling_layer=False))


class MeanPooledEncoder(torch.nn.Module):
    def __init__(self, bert: torch.nn.Module):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask)[0]
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        summed = (hidden * mask).sum(dim=1)
        pooled = summed / mask.sum(dim=1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled.float(), p=2.0, dim=-1)
