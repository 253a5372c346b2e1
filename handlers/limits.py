"""What one request may cost, the same on every route.

A request may carry several inputs (KServe v1 `instances`, Open Inference Protocol v2 `shape[0]`,
OpenAI `input` as a list): each becomes an item of the batch's one forward pass, so one HTTP request
may multiply the batch TorchServe formed (batchSize counts requests, not inputs). MAX_INSTANCES
bounds that on every route; each input is then held to its family's own limits (body size, tokens,
elements), so a request costs at most MAX_INSTANCES of its family's largest input.
"""

from __future__ import annotations

from handlers.errors import PayloadTooLarge

MAX_INSTANCES = 64  # inputs per request, on every route


def check_instances(count: int, field: str) -> None:
    """Refuse a request of more than MAX_INSTANCES inputs (413), naming the field that holds them."""
    if count > MAX_INSTANCES:
        raise PayloadTooLarge(f"{field}: {count} inputs, over the limit of {MAX_INSTANCES} per request: split the "
                              "request", param=field)
