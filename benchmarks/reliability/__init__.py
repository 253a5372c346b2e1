"""`python -m benchmarks.reliability`: bad input, injected faults, overload, soak and security
checks on real servers, one table. Each check also runs alone: `python -m benchmarks.reliability.soak`."""
