# Benchmarks (issue 9): `make bench` runs every bench/bench_*.py `run()` into bench/report.{json,md}
# and copies the simulator's plot to bench/sim.png. A failing benchmark is reported as failed in the
# report and makes the target exit non-zero after the report is written.
# Other capabilities' tool prerequisites are named here only when their mk file exists.
# ONLY=bench_e2e,bench_sim_vs_e2e MERGE=1 reruns those modules and keeps the rest of the report (after a `make e2e`).

.PHONY: bench

bench: venv $(if $(wildcard mk/observability.mk),observability-tools)
	$(PY) -m bench.run $(if $(ONLY),--only $(ONLY)) $(if $(MERGE),--merge)
