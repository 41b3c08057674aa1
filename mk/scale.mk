# Production scale (issue 47): the stack at its own size on the local control plane (tools/localcluster/scale.py),
# kwok nodes from the stack's pools, the control plane tuned for the size, gangs submitted through the CLI.
# `make test` runs the same code path on the small shape (tests/test_scale_cluster.py); the full runs are here.
.PHONY: scale-up scale-down bench-scale

SHAPE ?= small
SCALE_SHAPES ?= prod llama3
SCALE_RUNS ?= 5

scale-up: venv localcluster
	$(PY) -m tools.localcluster.scalerun up --shape $(SHAPE)

scale-down: venv
	$(PY) -m tools.localcluster.scalerun down --shape $(SHAPE)

# Each shape: up, its gangs (SCALE_RUNS each) and fault storms, down; then `pulumi up`, a no-change preview and a
# no-change up on the real engine at the shape's size; then the bench_scale section of bench/report.{md,json}.
bench-scale: venv localcluster engine observability-tools
	@for shape in $(SCALE_SHAPES); do \
	  $(PY) -m tools.localcluster.scalerun bench --shape $$shape --runs $(SCALE_RUNS) || exit 1; \
	  $(PY) -m tools.localcluster.scalerun pulumi --shape $$shape || exit 1; done
	$(PY) -m bench.run --only bench_scale --merge
