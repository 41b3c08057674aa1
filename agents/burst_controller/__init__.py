"""Burst controller: owns the burst taint on virtual-kubelet nodes so inference spills to external GPUs
only while on-prem GPUs are exhausted, and comes home (NoSchedule, never NoExecute) when they free up.

Public API (small on purpose; the simulator and the tests use exactly this):

- `settings.BurstSettings` — frozen dataclass of every knob; `BurstSettings.from_mapping(dict, source=)`
  and `BurstSettings.from_file(path)` validate and raise `SettingsError` naming the key and the file.
- `view.ClusterView(settings)` — incremental aggregates fed with API-shaped JSON objects:
  `apply_node(event_type, obj)`, `apply_pod(event_type, obj)` (event_type ADDED/MODIFIED/DELETED, O(1)),
  `replace_nodes(items, now)`, `replace_pods(items, now)`, `ClusterView.from_lists(nodes, pods, settings,
  now)`, `mark_fresh(now)`, `mark_unsynced()`, `snapshot() -> Snapshot`.
- `decide.decide(snapshot, state, now, settings) -> Decision` — pure; `Decision.actions` (tuple of
  `Action(kind=OPEN_NODE|CLOSE_NODE|SET_DELETION_COST, node, namespace, pod, deletion_cost)`),
  `Decision.state` (the next `BurstState`), `Decision.reasons`, `Decision.flipped` (`Mode` or None).
- `decide.state_from_snapshot(snapshot, now) -> BurstState` — the restart path: mode from the taints.
- `fixtures.onprem_node / virtual_node / gpu_pod` — builders of API-shaped objects for tests and simulation.

The I/O shell (`shell.BurstShell`) and the entry point (`cli.main`, console script `burst-controller`)
are for running in the cluster, not for import by other code.
"""
