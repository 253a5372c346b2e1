"""The handler TorchServe runs for an archive in its asynchronous worker mode (`asyncCommunication:
true` in model-config.yaml, written for a causal LM with `causal_lm.mode: async`).

TorchServe's async worker (ts/async_service.py) awaits the entry point for each request as it
arrives, so `handle` is a coroutine; everything else is the handler's own (handlers/handler.py).
TorchServe takes the one class this module defines as the handler.
"""

from __future__ import annotations

from typing import Any, Optional

from handlers.errors import ConfigError
from handlers.handler import Handler


class AsyncHandler(Handler):
    async def handle(self, data: Optional[list[Any]], context) -> Optional[list[bytes]]:
        if data is None:
            return None
        if self.generation is None or not hasattr(self.generation, "loop"):
            raise ConfigError(f"{self.model_name}: the asynchronous worker mode serves causal_lm with mode: async")
        requests = self.engine.requests(data, context, None)
        replies = await self.generation.serve(requests, context)
        return self.engine.reply(context, requests, replies)
