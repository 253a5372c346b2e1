"""Measuring tools around TorchServe, one wing per tool; dependencies run one way:

    tune -> bench -> load        reliability -> load        (each wing may use serving/ and below)

load/         load generation (closed and open loop), its statistics, process and Prometheus readings
bench/        one model: served vs the in-process limit vs the stock baseline, report + plots
tune/         search -> write config.properties (models=) -> verify
reliability/  bad input, faults, overload, soak, security

The servers come from serving/ (the package that starts and drives TorchServe). `handlers/`,
`build/` and `serving/` import nothing from here.
"""
