"""Text embedders: text in, {"embedding": [floats]} out, from any Hugging Face encoder.

Pooled over the attention mask (mean, as sentence-transformers does, or the [CLS] token), then
L2-normalised unless settings say otherwise. Batches are padded to their longest sequence rounded
up to a bucket, not to max_length, and a batch of mixed lengths runs as groups of like length.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional

import numpy as np
import torch

from handlers.errors import BadInput, ConfigError, UnsupportedMediaType
from handlers.families import text_cases
from handlers.families.base import Family
from handlers.families.cases import Case
from handlers.families.length_groups import length_groups
from handlers.families.pooling import PooledEncoder
from handlers.json_body import check_size, parse_json

# WordPiece maps a word longer than 100 characters to [UNK], so one token never spans more:
# cutting the text here can't change the first max_length tokens, and bounds tokenizer time.
_MAX_CHARS_PER_TOKEN = 100
# A character the tokenizer keeps: not whitespace, not a C0/C1 control character.
_VISIBLE = re.compile(r"[^\s\x00-\x1f\x7f-\x9f]")
# Padding tokens of the common vocabularies, tried when the tokenizer file configures none.
_PAD_TOKENS = ("[PAD]", "<pad>")


@dataclass(frozen=True)
class TextSettings:
    """settings.text_embedder: tokenizer file, truncation, padding buckets, pooling."""

    tokenizer: str = "tokenizer.json"  # archive file in the tokenizers library's format
    max_length: int = 256
    pad_bucket: int = 16
    pad_to_max_length: bool = False  # the naive path: every request padded to max_length
    pad_token: Optional[str] = None  # none: the tokenizer file's own padding, else [PAD] or <pad>
    pooling: Literal["mean", "cls"] = "mean"
    normalize: bool = True
    max_body_bytes: int = 1024 * 1024
    # A forward pass's fixed cost, in padded tokens: a batch of texts of different lengths runs as
    # groups of like length (handlers/families/length_groups.py) where that saves more than this per pass.
    pass_cost_tokens: int = 64

    def __post_init__(self):
        if self.pad_bucket < 1 or self.max_length < 2:
            raise ConfigError("text_embedder.pad_bucket must be >= 1 and text_embedder.max_length >= 2")
        if self.max_body_bytes < 1:
            raise ConfigError(f"text_embedder.max_body_bytes: must be >= 1, got {self.max_body_bytes}")
        if self.pass_cost_tokens < 0:
            raise ConfigError(f"text_embedder.pass_cost_tokens: must be >= 0, got {self.pass_cost_tokens}")


def text_from_body(body: Any, content_type: str, settings: TextSettings) -> str:
    """Accept JSON {"text": "..."} or a text/plain body; say exactly what is wrong otherwise."""
    if isinstance(body, (bytes, bytearray)):
        if len(body) == 0:
            raise BadInput('empty request body: send JSON {"text": "..."} or text/plain')
        check_size(body, settings.max_body_bytes)
        try:
            decoded = bytes(body).decode("utf-8")
        except UnicodeDecodeError as err:
            raise BadInput(f"body is not valid UTF-8 (byte {err.start})") from None
        if content_type == "application/json":
            body = parse_json(body)
        elif content_type in ("", "text/plain", "application/octet-stream") or content_type.startswith("text/"):
            body = decoded
        else:
            raise UnsupportedMediaType(f"content type {content_type!r} not supported: use application/json or text/plain")
    # TorchServe hands text/* and JSON bodies over already decoded: the size limit applies to them too.
    check_size(body, settings.max_body_bytes, "text" if isinstance(body, str) else "body")
    if isinstance(body, dict):
        if "text" not in body:
            raise BadInput('JSON body has no "text" field: send {"text": "..."}')
        body = body["text"]
        if not isinstance(body, str):
            raise BadInput(f'"text" must be a string, got {type(body).__name__}')
    elif not isinstance(body, str):
        raise BadInput(f'expected JSON {{"text": "..."}} or text/plain, got JSON {type(body).__name__}')
    if not body.strip():
        raise BadInput("text is empty")
    text = body[: settings.max_length * _MAX_CHARS_PER_TOKEN]
    if not _VISIBLE.search(text):
        raise BadInput("text has no visible characters (only whitespace and control characters)")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:  # a JSON escape such as "\\ud800": the tokenizer would fail the batch
        raise BadInput(f"text holds an unpaired surrogate at character {err.start}: not valid Unicode") from None
    return text


def load_tokenizer(path: Path, settings: TextSettings):
    """The tokenizer, truncating to max_length and padding to a bucket (or to max_length)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path))
    configured = tokenizer.padding
    token = settings.pad_token or (configured["pad_token"] if configured else None)
    token = token or next((t for t in _PAD_TOKENS if tokenizer.token_to_id(t) is not None), None)
    pad_id = None if token is None else tokenizer.token_to_id(token)
    if pad_id is None:
        raise ConfigError(f"text_embedder.pad_token: {token or 'no padding token'} is not in {path.name}: name one")
    tokenizer.enable_truncation(max_length=settings.max_length)
    if settings.pad_to_max_length:
        tokenizer.enable_padding(pad_id=pad_id, pad_token=token, length=settings.max_length)
    else:
        tokenizer.enable_padding(pad_id=pad_id, pad_token=token, pad_to_multiple_of=settings.pad_bucket)
    return tokenizer


class TextEmbedder(Family):
    name = "text_embedder"
    request_content_type = "text/plain"
    stock_baseline = "text"
    openai_endpoints = frozenset({"embeddings", "models", "model"})
    input_kind = "text"
    Settings = TextSettings
    naive = {"pad_to_max_length": True, "max_length": 128}

    def __init__(self, settings: TextSettings, model_dir: Path, channels_last: bool = False) -> None:
        super().__init__(settings, model_dir, channels_last)
        self.tokenizer = load_tokenizer(model_dir / settings.tokenizer, settings)

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return PooledEncoder(model, self.settings.pooling, self.settings.normalize)

    def item_tokens(self, inputs: tuple[torch.Tensor, torch.Tensor]) -> list[int]:
        """The tokens the model reads of each text (OpenAI's usage counts), truncation included and
        padding not: from the batch's own tokenisation, so no text is tokenised twice."""
        return inputs[1].sum(dim=1).tolist()

    def decode(self, body, content_type: str) -> str:
        return text_from_body(body, content_type, self.settings)

    def collate(self, items: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        encodings = self.tokenizer.encode_batch(list(items))
        ids = torch.from_numpy(np.array([e.ids for e in encodings], dtype=np.int64))
        mask = torch.from_numpy(np.array([e.attention_mask for e in encodings], dtype=np.int64))
        return ids, mask

    def run(self, forward, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """The batch in groups of like length, each padded to its own longest: one long text no
        longer makes every short one of its batch cost as much."""
        ids, mask = batch
        if self.settings.pad_to_max_length:  # the naive path: every row at max_length, one pass
            return forward(batch)
        groups = length_groups(mask.sum(dim=1).tolist(), self.settings.pad_bucket, self.settings.pass_cost_tokens)
        if len(groups) <= 1:
            return forward(batch)
        parts = torch.cat([forward((ids[rows, :width].contiguous(), mask[rows, :width].contiguous()))
                           for rows, width in groups])
        order = torch.tensor([row for rows, _ in groups for row in rows], device=parts.device)
        outputs = torch.empty_like(parts)
        outputs[order] = parts
        return outputs

    def postprocess(self, outputs: torch.Tensor, inputs) -> list[dict]:
        return [{"embedding": row} for row in outputs.float().cpu().tolist()]

    def example_batch(self, size: int):
        # Mixed lengths: padding inside the batch, so a traced graph keeps the attention-mask path.
        texts = ["A short one.", "A longer warm-up sentence, so that this batch holds padded positions."]
        return self.collate([texts[i % 2] for i in range(size)])

    def warm_batches(self, size: int, every_shape: bool) -> Sequence[tuple[torch.Tensor, torch.Tensor]]:
        """On a GPU, one batch per padded length `run` forms (each bucket up to max_length, one pass
        each): a TorchScript graph compiles per shape, so no request meets an uncompiled length."""
        if not every_shape or self.settings.pad_to_max_length:
            return (self.example_batch(size),)
        ids, mask = self.collate(["warm " * self.settings.max_length] * size)  # truncated to max_length
        bucket, top = self.settings.pad_bucket, ids.shape[1]
        widths = sorted({*range(bucket, top + 1, bucket), top})
        return tuple((ids[:, :width].contiguous(), mask[:, :width].contiguous()) for width in widths)

    def gate_kind(self) -> str:
        return "embedding"

    @classmethod
    def bad_inputs(cls, settings: TextSettings) -> list[Case]:
        return cls.stamped(text_cases.cases())

    @classmethod
    def answer_problem(cls, settings: TextSettings, answer) -> Optional[str]:
        vector = answer.get("embedding") if isinstance(answer, dict) else None
        if not isinstance(vector, list) or not vector or not all(isinstance(v, (int, float)) for v in vector):
            return f'expected {{"embedding": [numbers]}}, got {str(answer)[:80]}'
        return None

    @classmethod
    def disagreement(cls, settings: TextSettings, one, other) -> Optional[str]:
        a, b = (np.asarray(x["embedding"], dtype=np.float64) for x in (one, other))
        if a.shape != b.shape:
            return f"embedding sizes {a.shape} vs {b.shape}"
        cosine = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) or 1.0))
        return None if cosine >= 0.9999 else f"cosine {cosine:.6f} < 0.9999"
