"""The context of one message that answers several requests, each of which came with its own.

In TorchServe's asynchronous mode every message arrives with its own context (ts/async_service.py
deep-copies the worker's context per message, usually holding one request) and the answer's status,
content type and headers are read back from that context when the message is answered. The async
engine loop sends what one step streams, to every request it moved, as one message (StepMessages in
handlers/generation/async_serving.py). That message's requests are indices 0..n-1 of this context,
which forwards each index to the request's own context and its index there, so what is set or read
lands where TorchServe keeps it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional


class BatchContext:
    def __init__(self, parts: Sequence[tuple[Any, int]]) -> None:
        """`parts`: per request of the batch, (the context it came with, its index in that context)."""
        if not parts:
            raise ValueError("a batch holds one request at least")
        self.parts = list(parts)
        first = self.parts[0][0]
        self.model_name = first.model_name
        self.manifest = getattr(first, "manifest", None)
        self.system_properties = first.system_properties
        self.model_yaml_config = getattr(first, "model_yaml_config", None)
        # The handler's metrics are logged as they are added: any one message's object reports them.
        self.metrics = getattr(first, "metrics", None)
        self.cl_socket = getattr(first, "cl_socket", None)  # the worker's one socket: where a message goes
        self.request_ids = {idx: _request_id(context, at) for idx, (context, at) in enumerate(self.parts)}
        self.stopping_criteria = None

    @property
    def request_processor(self) -> list[Any]:
        """Each request's own header and status holder (TorchServe's RequestProcessor), by batch index."""
        return [_processor(context, at) for context, at in self.parts]

    def get_request_id(self, idx: int = 0) -> Optional[str]:
        return self.request_ids.get(idx)

    def get_request_header(self, idx: int, key: str) -> Optional[str]:
        context, at = self.parts[idx]
        return context.get_request_header(at, key)

    def get_all_request_header(self, idx: int) -> dict[str, str]:
        context, at = self.parts[idx]
        return context.get_all_request_header(at)

    def set_response_status(self, code: int = 200, phrase: str = "", idx: int = 0) -> None:
        context, at = self.parts[idx]
        context.set_response_status(code, phrase, at)

    def set_all_response_status(self, code: int = 200, phrase: str = "") -> None:
        for idx in range(len(self.parts)):
            self.set_response_status(code, phrase, idx)

    def get_response_status(self, idx: int):
        context, at = self.parts[idx]
        return context.get_response_status(at)

    def set_response_content_type(self, idx: int, value: str) -> None:
        context, at = self.parts[idx]
        context.set_response_content_type(at, value)

    def get_response_content_type(self, idx: int) -> Optional[str]:
        context, at = self.parts[idx]
        return context.get_response_content_type(at)

    def set_response_header(self, idx: int, key: str, value: str) -> None:
        context, at = self.parts[idx]
        context.set_response_header(at, key, value)

    def get_response_headers(self, idx: int) -> dict[str, str]:
        context, at = self.parts[idx]
        return context.get_response_headers(at)


def _request_id(context, idx: int) -> Optional[str]:
    ids = getattr(context, "request_ids", None) or {}
    return ids.get(idx)


def _processor(context, idx: int) -> Any:
    processors = getattr(context, "request_processor", None)
    return None if processors is None else processors[idx]
