"""TorchServe handler package: shipped inside every model archive, structure kept.

Importing this package does no work: no env reads, no backend probing, no logging setup.
"""
