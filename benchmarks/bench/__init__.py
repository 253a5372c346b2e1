"""`python -m benchmarks.bench`: one model served vs its in-process limit vs the stock baseline.

`python -m benchmarks.bench.inprocess`: the handler's settings against the naive path, no server.
"""
