"""Start TorchServe, drive load, read metrics, compare to references.

`benchmarks.launcher.TorchServe` is the one launcher that tests, benchmarks and the tuner use.
"""
