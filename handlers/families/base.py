"""What a model family is: the part of serving that depends on what the model takes and returns.

The handler (handlers/handler.py) owns the request loop and every optimisation; a family only says
how one request becomes an item (`decode`, raising BadInput with what is wrong), how items become
a batch (`collate`), what the model's output means (`postprocess`), and what a realistic batch
looks like (`example_batch`, for warm-up and for tracing at build time). Its settings are one
frozen dataclass, `settings.<family name>` in the catalogue. The model itself comes from the
catalogue entry's source; `wrap` may put a head around it (pooling for an encoder, say).

What every tool needs from a family lives here too, so a new family touches this folder and the
catalogue, nothing else: the requests its models must answer or refuse (`bad_inputs`, which the
reliability corpus and the tests send), what a well-formed answer is (`answer_problem`), when two
answers to one request agree (`disagreement`), its example inputs (`example_inputs`), how the
build's accuracy gate compares outputs (`gate_kind`) and which stock TorchServe handler the bench
compares it with (`stock_baseline`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Optional, Union

import torch

from handlers.families.cases import JSON, Case, invalid, json_body, unique

Inputs = Union[torch.Tensor, tuple[torch.Tensor, ...]]


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
    # The transformers Auto class that builds a Hugging Face source for this family.
    huggingface_class: ClassVar[str] = "AutoModel"
    # Files of a Hugging Face model folder the family reads beside its tokenizer.json (the build stages them).
    huggingface_files: ClassVar[tuple[str, ...]] = ()
    # The usual Content-Type of a request body (the tools send an over-limit body with it).
    request_content_type: ClassVar[str] = JSON
    # The stock TorchServe handler the bench compares the family with ("image", "text"), or None.
    stock_baseline: ClassVar[Optional[str]] = None
    # OpenAI's routes a model of the family answers (handlers/openai/routes.py): the models list here.
    openai_endpoints: ClassVar[frozenset] = frozenset({"models", "model"})

    def __init__(self, settings: Any, model_dir: Path, channels_last: bool = False) -> None:
        """`model_dir`: where the archive's files are (labels, tokenizer, ...); `channels_last`: the
        memory layout the model runs in (image batches can be collated straight into it)."""
        self.settings = settings
        self.channels_last = channels_last

    @classmethod
    def archive_keys(cls, settings: Any) -> Mapping[str, Any]:
        """Keys a model with these settings needs in its archive's model-config.yaml, beside
        `handler:` (TorchServe's frontend modes)."""
        return {}

    @classmethod
    def handler_entry(cls, settings: Any) -> str:
        """The archive's handler file, a path inside the handlers package's folder (a module with one
        handler class): TorchServe imports it from the archive's root."""
        return "handlers/handler.py"

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The served module around the source model (the identity unless the family adds a head)."""
        return model

    def decode(self, body: Any, content_type: str) -> Any:
        """One request's body (bytes, or what TorchServe decoded: str, dict, list) -> one item."""
        raise NotImplementedError

    def collate(self, items: Sequence[Any]) -> Inputs:
        raise NotImplementedError

    def model_inputs(self, batch: Any) -> tuple[torch.Tensor, ...]:
        """The model's forward arguments from what `collate` or `example_batch` returned. A family
        whose answers depend on per-request options collates them beside its tensors and hands
        `postprocess` the whole batch (handlers/families/forecaster.py)."""
        return batch if isinstance(batch, tuple) else (batch,)

    def run(self, forward: Callable[[Any], torch.Tensor], batch: Any) -> torch.Tensor:
        """The model's outputs for a collated batch, one row per item in order. `forward(part)` is one
        forward pass (the handler's: device, layout, precision) on a batch in `collate`'s form; a
        family whose items differ in cost may run it on parts of the batch and join the rows."""
        return forward(batch)

    def postprocess(self, outputs: torch.Tensor, inputs: Inputs) -> list[Any]:
        """One JSON-ready answer per item of the batch."""
        raise NotImplementedError

    def item_tokens(self, inputs: Any) -> Optional[list[int]]:
        """Each item's token count in a collated batch (OpenAI's usage), or None for a family without tokens."""
        return None

    def example_batch(self, size: int) -> Inputs:
        raise NotImplementedError

    def warm_batches(self, size: int, every_shape: bool) -> Sequence[Inputs]:
        """The warm-up's batches of `size` rows: with `every_shape` (a GPU, where each input shape
        compiles and tunes its own kernels) one per shape the handler forms at that size, else one."""
        return (self.example_batch(size),)

    def gate_kind(self) -> str:
        """How the build's accuracy gate (build/gate.py) compares a variant's raw outputs with fp32's:
        "classification" (logits: top-1 agreement), "embedding" (cosine) or "tensor" (a tolerance)."""
        return "tensor"

    # ---- what the tools need from a family -------------------------------------------------
    @classmethod
    def bad_inputs(cls, settings: Any) -> list[Case]:
        """Requests a model of this family must answer itself, each with its outcome: valid edge
        cases (200 and a well-formed answer) and invalid ones (a 4xx whose message names the
        problem). `settings`: the model's family settings. A family adds its own to these."""
        cases = [
            invalid("empty body", b"", JSON, 400),
            invalid("malformed JSON", b'{"a": [1, 2', JSON, 400),
            invalid("a JSON string, not an object", json_body("text"), JSON),
        ]
        return cls.stamped(cases)

    @classmethod
    def stamped(cls, cases: list[Case]) -> list[Case]:
        """The cases, marked as this family's, names checked unique."""
        return unique([Case(c.name, cls.name, c.body, c.content_type, c.valid, c.status, c.words, c.layer, c.source)
                       for c in cases])

    @classmethod
    def example_inputs(cls, settings: Any) -> list[Case]:
        """Requests a model of this family answers: the valid ones of its cases (the tools send
        them when a catalogue entry lists no examples of its own)."""
        return [case for case in cls.bad_inputs(settings) if case.valid]

    @classmethod
    def answer_problem(cls, settings: Any, answer: Any) -> Optional[str]:
        """What is wrong with a 200's JSON answer, or None when it is well formed."""
        return None if isinstance(answer, (dict, list)) else f"expected a JSON object, got {str(answer)[:80]}"

    @classmethod
    def disagreement(cls, settings: Any, one: Any, other: Any) -> Optional[str]:
        """How two answers to one request differ beyond this family's tolerance, or None.
        Default: the same JSON, numbers within 1e-3 relative (1e-4 absolute)."""
        return _json_difference(one, other, "answer")


def _json_difference(one: Any, other: Any, where: str) -> Optional[str]:
    if isinstance(one, bool) or isinstance(other, bool) or not all(isinstance(v, (int, float)) for v in (one, other)):
        if isinstance(one, dict) and isinstance(other, dict):
            if set(one) != set(other):
                return f"{where}: keys {sorted(one)} vs {sorted(other)}"
            return next(filter(None, (_json_difference(one[k], other[k], f"{where}.{k}") for k in one)), None)
        if isinstance(one, list) and isinstance(other, list):
            if len(one) != len(other):
                return f"{where}: {len(one)} vs {len(other)} items"
            return next(filter(None, (_json_difference(a, b, f"{where}[{i}]") for i, (a, b) in enumerate(zip(one, other)))),
                        None)
        return None if one == other else f"{where}: {str(one)[:40]} vs {str(other)[:40]}"
    return None if math.isclose(one, other, rel_tol=1e-3, abs_tol=1e-4) else f"{where}: {one} vs {other}"
