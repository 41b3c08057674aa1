"""Glue shared by `make simulate`, `make bench` and the tests: stack → model, workload → outcomes."""

from __future__ import annotations

from dataclasses import dataclass, replace

from agents.burst_controller.contract import BurstSettings
from bench.sim.engine import Outcome, simulate
from bench.sim.model import ClusterModel
from bench.sim.policies import NEVER, Policy, all_policies, foresighted
from bench.sim.workload import DAY, Workload, WorkloadSpec, generate
from components.burst_controller import settings_from_config
from components.config import load_stack as validated_stack
from components.config import stack_path


@dataclass(frozen=True)
class StackSetup:
    """What the simulator takes from a stack: cluster shape and the burst controller's settings."""

    stack: str
    model: ClusterModel
    settings: BurstSettings


def load_stack(stack: str) -> StackSetup:
    """Validate the stack file exactly as `pulumi up` does, then read the parts the simulation needs."""
    cfg = validated_stack(stack_path(stack))
    return StackSetup(stack, ClusterModel.from_config(cfg), settings_from_config(cfg))


def default_workload(model: ClusterModel, days: float, seed: int, warmup_days: float,
                     spec: WorkloadSpec | None = None) -> Workload:
    pools = [(p.name, p.nodes) for p in model.pools]
    return generate(pools, [s.name for s in model.services], (days + warmup_days) * DAY, seed, spec)


def compare(model: ClusterModel, settings: BurstSettings, workload: Workload, days: float, warmup_days: float,
            policies: list[Policy] | None = None) -> list[Outcome]:
    """Every policy on the same workload, in table order."""
    chosen = policies if policies is not None else all_policies(model, settings, workload.spec)
    return [simulate(model, workload, p, days * DAY, warmup_days * DAY) for p in chosen]


#: The availability bound's row: the services alone, on idle on-prem GPUs.
INFERENCE_ALONE = "inference alone"


def inference_alone(model: ClusterModel, workload: Workload, days: float, warmup_days: float,
                    foresight: bool = False) -> Outcome:
    """The same services, HPAs and demand with no training at all: every replica starts on-prem in the on-prem
    start time and nothing is ever preempted. With the replicas the services' HPAs ask for, no policy that
    shares the GPUs with training and reacts to demand (rather than foreseeing it) serves more, so this bounds
    availability where the zero-lag oracle cannot: what is left is the demand's jumps beyond the HPA headroom
    during a pod's start. Only more replicas than the HPAs ask for (more headroom) move it. `foresight`: with a
    perfect forecast in the HPAs (`policies.foresighted`), the bound for a controller that has one."""
    policy = Policy(INFERENCE_ALONE, NEVER)
    if foresight:
        policy = replace(foresighted(policy, model), name=INFERENCE_ALONE)
    return simulate(model, replace(workload, gangs=()), policy, days * DAY, warmup_days * DAY)
