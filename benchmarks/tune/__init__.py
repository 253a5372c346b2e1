"""`python -m benchmarks tune`: search batchSize / maxBatchDelay / workers for a model (or a traffic
mix: mix/), write them into config.properties' models= stanza, and verify the written file on a real server."""
