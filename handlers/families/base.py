"""What a model family is: the part of serving that depends on what the model takes and returns.

The handler (handlers/handler.py) owns the request loop and every optimisation; a family only says
how one request becomes an item (`decode`, raising BadInput with what is wrong), how items become
a batch (`collate`), what the model's output means (`postprocess`), and what a realistic batch
looks like (`example_batch`, for warm-up and for tracing at build time). Its settings are one
frozen dataclass, `settings.<family name>` in the catalogue. The model itself comes from the
catalogue entry's source; `wrap` may put a head around it (pooling for an encoder, say).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, List, Mapping, Sequence, Tuple, Union

import torch

Inputs = Union[torch.Tensor, Tuple[torch.Tensor, ...]]


class Family:
    name: ClassVar[str] = ""
    Settings: ClassVar[type] = type(None)  # a frozen dataclass; every field has a default
    # Settings of the naive path the in-process benchmark compares the optimised one with.
    naive: ClassVar[Mapping[str, Any]] = {}
    # What one request body is, for the KServe v1/v2 envelopes (handlers/kserve.py) to hand each
    # instance on in the form `decode` reads: "bytes" (binary, sent base64 in an envelope), "text"
    # (a string), "tensor" (also {"data": [flat values], "shape": [...]} JSON: v2's numeric
    # tensors), "json" (a JSON body).
    input_kind: ClassVar[str] = "json"
    # Generative families are served step by step with per-request state (handlers/generation/).
    generates: ClassVar[bool] = False
    # Keys the family needs in its archives' model-config.yaml, beside `handler:` (frontend modes).
    archive_config: ClassVar[Mapping[str, Any]] = {}
    # The transformers Auto class that builds a Hugging Face source for this family.
    huggingface_class: ClassVar[str] = "AutoModel"

    def __init__(self, settings: Any, model_dir: Path, channels_last: bool = False) -> None:
        """`model_dir`: where the archive's files are (labels, tokenizer, ...); `channels_last`: the
        memory layout the model runs in (image batches can be collated straight into it)."""
        self.settings = settings
        self.channels_last = channels_last

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The served module around the source model (the identity unless the family adds a head)."""
        return model

    def decode(self, body: Any, content_type: str) -> Any:
        """One request's body (bytes, or what TorchServe decoded: str, dict, list) -> one item."""
        raise NotImplementedError

    def collate(self, items: Sequence[Any]) -> Inputs:
        raise NotImplementedError

    def model_inputs(self, batch: Any) -> Tuple[torch.Tensor, ...]:
        """The model's forward arguments from what `collate` or `example_batch` returned. A family
        whose answers depend on per-request options collates them beside its tensors and hands
        `postprocess` the whole batch (handlers/families/forecaster.py)."""
        return batch if isinstance(batch, tuple) else (batch,)

    def postprocess(self, outputs: torch.Tensor, inputs: Inputs) -> List[Any]:
        """One JSON-ready answer per item of the batch."""
        raise NotImplementedError

    def example_batch(self, size: int) -> Inputs:
        raise NotImplementedError

    def gate_kind(self) -> str:
        """How the build's accuracy gate (build/gate.py) compares a variant's raw outputs with fp32's:
        "classification" (logits: top-1 agreement), "embedding" (cosine) or "tensor" (a tolerance)."""
        return "tensor"
