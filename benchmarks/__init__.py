"""Measuring tools around TorchServe, one wing per tool; dependencies run one way:

    tune -> bench -> load -> serving        reliability -> load -> serving

serving/      drive one TorchServe: launcher, config.properties, REST client, logs, metrics
load/         load generation (closed and open loop) and its statistics
bench/        one model: served vs the in-process limit vs the stock baseline, report + plots
tune/         search -> write config.properties (models=) -> verify
reliability/  bad input, faults, overload, soak, security

`handlers/` and `build/` import nothing from here. Every error raised on purpose is a
`benchmarks.serving.errors.LauncherError`.
"""
