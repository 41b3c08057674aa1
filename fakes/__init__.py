"""Test doubles of what the agents talk to, kept outside ``agents`` so no agent image ships them.

- :mod:`fakes.kube_api`: one in-memory Kubernetes API behind the kit's port (``MemoryApi``), for the tests and
  the benchmark of every agent;
- :mod:`fakes.burst_objects`: API-shaped nodes and pods as the burst controller's view reads them;
- :mod:`fakes.ib_sysfs`: ``/sys/class/infiniband`` trees for the InfiniBand exporter.

``tests/test_import_rules.py`` holds that nothing under ``agents`` imports this package.
"""
