# The chaos soak (issue 50): the local stack with every agent in its pods on real nodes, a fault every EVERY drawn
# with SEED, for DURATION; then the history check (fencing, one eviction per pod, recovery bounds, the PDB floors,
# the burst taint). The report goes to .state/chaos/report.json and bench_chaos. `make test` runs the same soak,
# short, on the stack of tests/test_e2e_stack_in_pods.py.
.PHONY: chaos

DURATION ?= 10m
EVERY ?= 30s
SEED ?= 1

chaos: venv localcluster engine images
	$(PY) -m tools.chaos --duration $(DURATION) --every $(EVERY) --seed $(SEED)
