"""Benchmarks for optimus-eqsat: a model zoo and a harness.

``benchmarks.zoo`` holds recommendation-style models with seeded random weights;
``benchmarks.harness`` compares eager, Inductor, Inductor with its own Optimus
passes, and the optimus_eqsat backend on them. Run ``python -m benchmarks -h``.
"""
