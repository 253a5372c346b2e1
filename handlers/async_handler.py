"""The handler TorchServe runs for an archive in its asynchronous worker mode (`asyncCommunication:
true` in model-config.yaml, written for a causal LM with `causal_lm.mode: async` and for a
request/response family with `runtime.batching: worker`).

TorchServe's async worker (ts/async_service.py) awaits the entry point for each request as it
arrives, so `handle` is a coroutine: a causal LM's requests go to its engine loop, the others to the
worker's batcher (handlers/worker_batcher.py); everything else is the request loop's own
(handlers/handler.py). TorchServe takes the one class this module defines as the handler.
"""

from __future__ import annotations

from typing import Any, Optional

from handlers.errors import ConfigError
from handlers.handler import Handler
from handlers.worker_batcher import WorkerBatcher


class AsyncHandler(Handler):
    batcher: Optional[WorkerBatcher] = None

    def initialize(self, context) -> None:
        super().initialize(context)
        rt = self.settings.runtime
        if rt.batching == "worker":
            self.batcher = WorkerBatcher(self.prepare, self.complete, self.max_batch_size, rt.batch_window_ms,
                                         self.model_name)

    async def handle(self, data: Optional[list[Any]], context) -> Optional[list[bytes]]:
        if data is None:
            return None
        if self.batcher is not None:
            return await self.batcher.handle(data, context)
        if self.generation is None or not hasattr(self.generation, "loop"):
            raise ConfigError(f"{self.model_name}: the asynchronous worker mode serves causal_lm with mode: async")
        return await self.generation.handle(data, context)
