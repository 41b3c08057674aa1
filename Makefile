# Stable commands: test, preview, render, policy, bench (see README). Every target installs what it needs.
SHELL := /bin/bash
PY := .venv/bin/python
STACK ?= prod
OUT ?= out/$(STACK)
STATE := .state
# Long steps (pip, apt, Go builds) print "<step>: still running after 2m30s" every 30 s (tools/progress.sh).
PROGRESS := bash tools/progress.sh
# $(call apt_install,<packages>): apt-get update + install, quietly, with the heartbeat.
apt_install = $(PROGRESS) "apt: installing $(1)" -- bash -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(1)'

.PHONY: venv test lint unit preview render policy bench
.DEFAULT_GOAL := preview

venv: .venv/.installed
.venv/.installed: requirements.txt pyproject.toml
	@test -x $(PY) || python3 -m venv .venv
	@$(PROGRESS) "venv: pip install -r requirements.txt" -- .venv/bin/pip install -q --disable-pip-version-check -r requirements.txt
	@.venv/bin/pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	@touch $@

lint: venv
	.venv/bin/ruff check .
	.venv/bin/mypy components agents fakes policies tools bench gpucluster_cli training_runtime __main__.py
	@# tools/localcluster is excluded as a tree (its Go modules live there); its typed modules are named here.
	.venv/bin/mypy tools/localcluster/realnodes.py tools/localcluster/hostcheck.py tools/localcluster/nodehost.py \
	  tools/localcluster/provisioner.py tools/localcluster/dcgm_standin.py tools/localcluster/prometheus_operator.py \
	  tools/localcluster/scale.py tools/localcluster/scalemeasure.py tools/localcluster/scalerun.py \
	  tools/localcluster/scalestorm.py tools/localcluster/fleet_standin.py tools/localcluster/watching.py \
	  tools/localcluster/scalepulumi.py tools/localcluster/scalecrash.py tools/localcluster/history.py \
	  tools/localcluster/rbac_usage.py tools/localcluster/processes.py tools/localcluster/scalejobs.py \
	  tools/localcluster/apiproxy.py tools/localcluster/realcluster.py tools/localcluster/supervise.py

# Tools the tests drive for real (promtool, node_exporter, fio) are installed before pytest runs;
# mk/*.mk add their own prerequisites (engine, local cluster, scanners) to this target.
unit: venv observability-tools checkpoint-tools
	.venv/bin/pytest -n 2 -q

test: lint unit

render: venv
	$(PY) -m tools.render --stack $(STACK) --out $(OUT)

# MOCK=1 skips the real engine (and its first build) and previews on the mock runtime only. The engine is
# your own `pulumi` when one at or above the SDK's version is on PATH, else the project's build;
# ENGINE=built or ENGINE=path chooses (tools/engine_select.py). The per-object diff goes to
# .state/preview/$(STACK).diff; DIFF=1 prints it here too.
preview: venv
	$(PY) -m tools.preview --stack $(STACK) $(if $(MOCK),--mock-only) $(if $(DIFF),--diff)

# Capability targets live in mk/*.mk, one file per capability, so they can change independently.
-include mk/*.mk
