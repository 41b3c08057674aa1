# Observability (issue 4): tools the observability tests need, the exporter smoke run and its benchmark.
# `make test` depends on `observability-tools` so promtool and node_exporter exist before pytest runs.

.PHONY: observability-tools observability-test observability-bench

# Debian's prometheus package ships promtool (check/test rules); prometheus-node-exporter is the peer
# the IB exporter is compared with. The guard keeps a machine that already has them from touching apt.
observability-tools: venv
	@command -v promtool >/dev/null || $(call apt_install,prometheus)
	@command -v prometheus-node-exporter >/dev/null || $(call apt_install,prometheus-node-exporter)

observability-test: observability-tools
	.venv/bin/pytest -q tests/test_ib_exporter.py tests/test_ib_vs_node_exporter.py tests/test_alert_rules.py \
		tests/test_dcgm_counters.py tests/test_health_guard_decide.py tests/test_health_guard_shell.py

observability-bench: observability-tools
	$(PY) -m bench.bench_ib
