"""Measuring tools around TorchServe, one command (`python -m benchmarks <verb>`: __main__.py lists
the verbs), one wing per concern; dependencies run one way:

    tune -> bench -> load        reliability -> load        (each wing may use serving/ and below)

load/         load generation (closed and open loop), its statistics, process and Prometheus readings;
              what every verb shares: options, report folder, tables (cli.py), the errors (errors.py)
bench/        one model: served vs the in-process limit vs the stock baseline, report + plots
tune/         search -> write config.properties (models=) -> verify
reliability/  bad input, faults, overload, soak, security

The servers come from serving/ (the package that starts and drives TorchServe). `handlers/`,
`build/` and `serving/` import nothing from here.
"""
