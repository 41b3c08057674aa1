"""Prometheus metrics a training process exposes on ``/metrics`` (scraped through the job's PodMonitor).

The names are the ones the alert rules watch (``components/alert_rules.py``): the step heartbeat (its
name is the stack's ``observability.stepHeartbeatMetric``, passed as ``TRAINING_HEARTBEAT_METRIC``) and
``gpucluster_checkpoint_duration_seconds``. ``namespace`` and ``job_name`` are added by the PodMonitor's
relabelling from the pod, so a process never has to know them; the process adds ``rank``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

CHECKPOINT_DURATION = "gpucluster_checkpoint_duration_seconds"
CHECKPOINT_STALL = "gpucluster_checkpoint_stall_seconds"
CHECKPOINT_BYTES = "gpucluster_checkpoint_bytes"
CHECKPOINT_LAST_STEP = "gpucluster_checkpoint_last_step"
CHECKPOINTS_SKIPPED = "gpucluster_checkpoints_skipped"
CHECKPOINT_LOAD = "gpucluster_checkpoint_load_seconds"
STEP = "training_step"
STEPS_PER_SECOND = "training_steps_per_second"
RESTARTS = "training_restarts"
RESUMED_FROM = "training_resumed_from_step"


class TrainingMetrics:
    """One registry per process; gauges labelled with the rank."""

    def __init__(self, heartbeat_metric: str, rank: int, *, clock: Callable[[], float] = time.time,
                 rate_window_seconds: float = 10.0) -> None:
        self.registry = CollectorRegistry()
        self.clock = clock
        self.rate_window = rate_window_seconds
        r = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, ["rank"], registry=r)

        rank_label = str(rank)
        self.heartbeat = gauge(heartbeat_metric, "Unix time of the last finished step (flat = no progress)"
                               ).labels(rank_label)
        self.step = gauge(STEP, "Last finished step").labels(rank_label)
        self.steps_per_second = gauge(STEPS_PER_SECOND, "Steps per second over the last window").labels(rank_label)
        self.checkpoint_duration = gauge(
            CHECKPOINT_DURATION, "Seconds from the last checkpoint's snapshot to its commit (rank 0) or to this "
            "rank's shard being durable").labels(rank_label)
        self.checkpoint_stall = gauge(
            CHECKPOINT_STALL, "Seconds the last checkpoint held up training (snapshot plus waiting for the "
            "previous write)").labels(rank_label)
        self.checkpoint_bytes = gauge(CHECKPOINT_BYTES, "Bytes this rank wrote for the last checkpoint"
                                      ).labels(rank_label)
        self.checkpoint_last_step = gauge(CHECKPOINT_LAST_STEP, "Step of the last checkpoint made durable"
                                          ).labels(rank_label)
        self.skipped = Counter(CHECKPOINTS_SKIPPED, "Checkpoints skipped at resume as partial or corrupt",
                               ["rank"], registry=r).labels(rank_label)
        self.restarts = gauge(RESTARTS, "Gang restarts seen when this process started (Volcano's job retry "
                              "count plus torchrun's worker restarts)").labels(rank_label)
        self.resumed_from = gauge(RESUMED_FROM, "Step this process resumed from (0: from scratch)"
                                  ).labels(rank_label)
        #: Labelled by where the shard came from (``local``: this pod's copy, ``shared``: the filesystem), so a
        #: restart in place that read the shared copy after all shows up beside the ones that did not.
        self.checkpoint_load = Gauge(
            CHECKPOINT_LOAD, "Seconds this process took to read and verify its shard of the checkpoint it resumed",
            ["rank", "source"], registry=r)
        self._rank_label = rank_label
        self._window_start: tuple[float, int] | None = None

    def loaded(self, source: str, seconds: float) -> None:
        self.checkpoint_load.labels(self._rank_label, source).set(seconds)

    def step_done(self, step: int) -> None:
        now = self.clock()
        self.heartbeat.set(now)
        self.step.set(step)
        if self._window_start is None:
            self._window_start = (now, step)
            return
        started, first = self._window_start
        if now - started >= self.rate_window:
            self.steps_per_second.set((step - first) / (now - started))
            self._window_start = (now, step)

    def serve(self, port: int) -> None:
        start_http_server(port, registry=self.registry)

    def exposed_names(self) -> set[str]:
        """Sample names as a scrape shows them (a counter ``x`` appears as ``x_total``)."""
        return {s.name for family in self.registry.collect() for s in family.samples}
