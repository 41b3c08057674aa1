# Cluster simulator (issue 9): `make simulate STACK=s [DAYS=n SEED=k OUT=file.png|dir]`.
# OUT left at the Makefile's default writes .state/simulate/<stack>.png; a path ending in .png is used as
# is; any other OUT is a directory that receives <stack>-simulate.png.
# Traces (issue 17): INFERENCE_TRACE=file [TRAINING_TRACE=file] replace the generated inference demand and/or
# gangs (formats in bench/sim/traces.py; bench/traces/ carries two public ones); JSON=path also writes the
# outcomes as JSON (policy name → figures).
# Demand families (issue 31): FAMILY=name replaces the inference demand with one of bench_families' cases, by its
# name in the report (`make simulate FAMILY=decays`, `FAMILY='steep-ramps + gangs on the ramps'`).

.PHONY: simulate simulate-test

DAYS ?= 7
SEED ?= 1

simulate: venv
	$(PY) -m tools.simulate --stack $(STACK) --days $(DAYS) --seed $(SEED) \
		$(if $(filter file,$(origin OUT)),,--out $(if $(filter %.png,$(OUT)),$(OUT),$(OUT)/$(STACK)-simulate.png)) \
		$(if $(INFERENCE_TRACE),--inference-trace $(INFERENCE_TRACE)) \
		$(if $(TRAINING_TRACE),--training-trace $(TRAINING_TRACE)) $(if $(JSON),--json $(JSON)) \
		$(if $(FAMILY),--family '$(subst ','\'',$(FAMILY))')

simulate-test: venv
	.venv/bin/pytest -q tests/test_sim.py
