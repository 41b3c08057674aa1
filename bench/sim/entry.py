"""The simulator's entry point for the tools that drive it (``tools/simulate.py``): everything a command line
needs, in one import, so a tool depends on this module and not on how the simulator is laid out inside."""

from __future__ import annotations

from bench.sim.cost import bill_lines, prices_from_config, run_costed
from bench.sim.demand import apply_traces, outcomes_json
from bench.sim.families import case_workload, cases
from bench.sim.policies import all_policies
from bench.sim.report import plot, print_table
from bench.sim.run import INFERENCE_ALONE, default_workload, inference_alone, load_stack
from bench.sim.workload import WorkloadSpec, load_trace

__all__ = [
    "INFERENCE_ALONE",
    "WorkloadSpec",
    "all_policies",
    "apply_traces",
    "bill_lines",
    "case_workload",
    "cases",
    "default_workload",
    "inference_alone",
    "load_stack",
    "load_trace",
    "outcomes_json",
    "plot",
    "prices_from_config",
    "print_table",
    "run_costed",
]
