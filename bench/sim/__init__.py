"""Discrete-event simulator of the unified GPU cluster, driven by the burst controller's own decision core.

`bench.sim.run.compare(...)` runs every policy on one seeded workload; `tools/simulate.py` is the CLI.
`engine` is the event loop and the measurements; the models share `cluster.ClusterState`: `scheduler`
(Volcano gangs and inference placement, with `replicasets`), `hpa`, `descheduler`, and `port`, the cluster
as the burst controller's adapter (`controller_adapter`) sees it.
"""
