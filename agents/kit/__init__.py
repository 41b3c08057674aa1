"""The run-side kit every in-cluster agent stands on (the deploy-side twin is ``components.system_agent``).

- :mod:`agents.kit.errors`: one error taxonomy for every API answer;
- :mod:`agents.kit.port`: one Kubernetes port (raw JSON, a timeout on every call) and the write fence;
- :mod:`agents.kit.lease`: one Lease elector (renew deadline, release on shutdown, ``can_write``);
- :mod:`agents.kit.loop`: one process entry (flags, settings, SIGTERM, ``/livez``, ``/readyz``, metrics).

Its in-memory twin for tests (:mod:`fakes.kube_api`) lives outside ``agents``, so no image ships it.
"""
