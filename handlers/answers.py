"""What the generation loops still write straight into TorchServe's context, through its adapter
(handlers/engines/torchserve.py): a refusal's status, and each gRPC answer marked as its last. The
batch loop returns Replies instead, and the adapter writes them."""

from __future__ import annotations

from handlers.engines.torchserve import TorchServe, set_status, status_phrase

__all__ = ["close_replies", "set_status", "status_phrase"]


def close_replies(context, size: int) -> None:
    """Each gRPC request's answer marked as its last (TorchServe.close)."""
    for request in TorchServe.requests([None] * size, context, None):
        TorchServe.close(context, request)
