"""Benchmarks for optimus-eqsat: a model zoo and a harness.

``benchmarks.zoo`` holds recommendation-style models with seeded random weights;
``benchmarks.harness`` compares eager, Inductor, Inductor with its own Optimus
passes, and the optimus_eqsat backend on them (on CUDA also with CUDA graphs and
combo kernels), timed side by side in interleaved rounds (``benchmarks.rounds``).
Run ``python -m benchmarks -h``; benchmarks/README.md describes the measurement.
"""
