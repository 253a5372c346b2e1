"""`python -m benchmarks reliability`: bad input, injected faults, overload, soak and security checks on
real servers, one table (suite.py). Each check also runs alone: `python -m benchmarks soak`, `deadlines`, ..."""
