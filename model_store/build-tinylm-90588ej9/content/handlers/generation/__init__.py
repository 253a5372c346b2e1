"""Text generation for the causal-LM family: request parameters, sampling, incremental text, the
batched KV cache and its engine, and the loop that serves it through TorchServe (continuous
batching: one decoding step per call, sequences kept by request id)."""
