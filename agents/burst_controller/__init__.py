"""Burst controller: owns the burst taint on virtual-kubelet nodes so inference spills to external GPUs
only while on-prem GPUs are exhausted, and comes home (NoSchedule, never NoExecute) when they free up.

Public API (small on purpose; the deploying component, the simulator and the tests use exactly this):

- `contract` — no I/O: `BurstTunables` (the stack's `burst` section derives from it: keys, bounds, defaults,
  descriptions), `BurstSettings` (the tunables plus what the stack derives; pydantic, frozen; `replace(**changes)`
  is a validated copy), `BurstSettings.parse(dict, source=)` raising `SettingsError` naming the key and the file,
  `Cover`,
  `BurstKeys(prefix)` (every label, taint, annotation and gate name, derived once), `standby_deployment`,
  and the bounds the stack config checks (`WATCH_TIMEOUT_SECONDS`, `MAX_TICK_SECONDS`,
  `MAX_STALE_AFTER_SECONDS`). The component builds the settings in one place:
  `components.burst_controller.settings_from_config(cfg)` (`BurstSettings.deployed(cfg.burst, ...)`), which the
  simulator calls too.
- `cli.load_file(path)` — the settings file (YAML or JSON) the process reads at start.
- `view.ClusterView(settings)` — incremental aggregates fed with API-shaped JSON objects:
  `apply_node(event_type, obj)`, `apply_pod(event_type, obj)` (event_type ADDED/MODIFIED/DELETED, O(1)),
  `replace_nodes(items, now)`, `replace_pods(items, now)`, `ClusterView.from_lists(nodes, pods, settings,
  now)`, `mark_fresh(now, kind=None)` (freshness per kind), `mark_unsynced()`, `snapshot() -> Snapshot`.
- `decide.decide(snapshot, state, now, settings) -> Decision` — pure, in named steps (`settle_clock`,
  `guards`, `next_mode`, `gate_release`, `actions`); `Decision.actions` (tuple of `Action(kind=OPEN_NODE|
  CLOSE_NODE|SET_DELETION_COST|SET_STANDBY|UNGATE, ...)`), `Decision.state` (the next `BurstState`),
  `Decision.reasons`, `Decision.flipped` (`Mode` or None).
- `decide.state_from_snapshot(snapshot, now) -> BurstState` — the restart path: mode from the taints.
- Outside the image: `fakes.burst_objects.onprem_node / virtual_node / gpu_pod` build API-shaped objects
  (`fakes.kube_api.MemoryApi` serves them behind the kit's port, for tests and the benchmark).

The I/O shell (`shell.BurstShell` over the kit's port: `agents.kit.port.HttpPort` for the real API) and the
entry point (`cli.main`, console script `burst-controller`) are for running in the cluster.
"""
