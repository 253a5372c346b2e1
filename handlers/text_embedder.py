"""Sentence embeddings (all-MiniLM-L6-v2): text in, {"embedding": [384 floats]} out.

Mean pooling over the attention mask, then L2 normalisation, as sentence-transformers computes them.
Batches are padded to their longest sequence rounded up to a bucket, not to max_length.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, List, Sequence, Tuple

import numpy as np
import torch

from handlers import runtime
from handlers.base import ModelHandler
from handlers.encoders import build_encoder
from handlers.errors import BadInput, PayloadTooLarge, UnsupportedMediaType
from handlers.settings import TextSettings

# WordPiece maps a word longer than 100 characters to [UNK], so one token never spans more:
# cutting the text here can't change the first max_length tokens, and bounds tokenizer time.
_MAX_CHARS_PER_TOKEN = 100
# A character the tokenizer keeps: not whitespace, not a C0/C1 control character.
_VISIBLE = re.compile(r"[^\s\x00-\x1f\x7f-\x9f]")


def text_from_body(body: Any, content_type: str, settings: TextSettings) -> str:
    """Accept JSON {"text": "..."} or a text/plain body; say exactly what is wrong otherwise."""
    if isinstance(body, (bytes, bytearray)):
        if len(body) == 0:
            raise BadInput('empty request body: send JSON {"text": "..."} or text/plain')
        if len(body) > settings.max_body_bytes:
            raise PayloadTooLarge(f"body is {len(body)} bytes, over the limit of {settings.max_body_bytes}")
        try:
            decoded = bytes(body).decode("utf-8")
        except UnicodeDecodeError as err:
            raise BadInput(f"body is not valid UTF-8 (byte {err.start})") from None
        if content_type == "application/json":
            try:
                body = json.loads(decoded)
            except (ValueError, RecursionError) as err:  # JSONDecodeError, or an int over 4300 digits
                raise BadInput(f"malformed JSON: {err}"[:300]) from None
        elif content_type in ("", "text/plain", "application/octet-stream") or content_type.startswith("text/"):
            body = decoded
        else:
            raise UnsupportedMediaType(f"content type {content_type!r} not supported: use application/json or text/plain")
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
    # TorchServe hands text/* and JSON bodies over already decoded: the size limit applies here too.
    size = len(body.encode("utf-8", "surrogatepass"))
    if size > settings.max_body_bytes:
        raise PayloadTooLarge(f"text is {size} bytes, over the limit of {settings.max_body_bytes}")
    text = body[: settings.max_length * _MAX_CHARS_PER_TOKEN]
    if not _VISIBLE.search(text):
        raise BadInput("text has no visible characters (only whitespace and control characters)")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:  # a JSON escape such as "\\ud800": the tokenizer would fail the batch
        raise BadInput(f"text holds an unpaired surrogate at character {err.start}: not valid Unicode") from None
    return text


class TextEmbedder(ModelHandler):
    family_settings_type = TextSettings

    def setup(self, model_dir: Path) -> None:
        from tokenizers import Tokenizer

        family: TextSettings = self.settings.family
        self.tokenizer = Tokenizer.from_file(str(model_dir / family.tokenizer))
        self.tokenizer.enable_truncation(max_length=family.max_length)
        if family.pad_to_max_length:
            self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]", length=family.max_length)
        else:
            self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]", pad_to_multiple_of=family.pad_bucket)

    @classmethod
    def build_model(cls, family: TextSettings, model_dir: Path) -> torch.nn.Module:
        return build_encoder(model_dir / family.config, family.normalize)

    def decode(self, body, content_type: str) -> str:
        return text_from_body(body, content_type, self.settings.family)

    def collate(self, items: Sequence[str]) -> Tuple[torch.Tensor, torch.Tensor]:
        encodings = self.tokenizer.encode_batch(list(items))
        ids = torch.from_numpy(np.array([e.ids for e in encodings], dtype=np.int64))
        mask = torch.from_numpy(np.array([e.attention_mask for e in encodings], dtype=np.int64))
        return ids, mask

    def forward(self, inputs: Tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        ids, mask = (runtime.to_device(t, self.device) for t in inputs)
        return self.model(ids, mask)

    def postprocess(self, outputs: torch.Tensor, inputs) -> List[dict]:
        return [{"embedding": row} for row in outputs.float().cpu().tolist()]

    def example_batch(self, batch_size: int):
        # Mixed lengths: padding inside the batch, so a traced graph keeps the attention-mask path.
        texts = ["A short one.", "A longer warm-up sentence, so that this batch holds padded positions."]
        return self.collate([texts[i % 2] for i in range(batch_size)])

