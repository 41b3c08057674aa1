"""Discrete-event simulator of the unified GPU cluster, driven by the burst controller's own decision core.

`bench.sim.run.compare(...)` runs every policy on one seeded workload; `tools/simulate.py` is the CLI.
"""
