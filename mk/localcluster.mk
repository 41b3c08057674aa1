# The local control plane (issue 8): etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# kwok, Volcano and the descheduler built from Go modules into $(STATE)/localcluster/bin and run as
# local processes on 127.0.0.1. tools/localcluster/build.sh keeps a stamp keyed on go.mod/go.sum and
# our mains, so a warm `make localcluster` takes seconds.
.PHONY: localcluster localcluster-optional localcluster-tools up down localcluster-status e2e

LOCALCLUSTER := tools/localcluster/localcluster

# openssl makes the cluster's certificates; the guard keeps a machine that has it from touching apt.
localcluster-tools:
	@command -v openssl >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openssl)
	@command -v go >/dev/null || { echo "localcluster: needs Go >= 1.26 on PATH (go.mod of tools/localcluster)"; exit 1; }

localcluster: localcluster-tools
	@mkdir -p $(STATE)/localcluster
	@bash tools/localcluster/build.sh

# Before the unit tests: build if this machine can; when it cannot, say so in one line and go on
# (tests/test_localcluster.py then skips with the reason).
localcluster-optional:
	@mkdir -p $(STATE)/localcluster
	@$(MAKE) --no-print-directory localcluster > $(STATE)/localcluster/build-make.log 2>&1 \
	  && tail -n 1 $(STATE)/localcluster/build-make.log \
	  || echo "localcluster: not built on this machine (see $(STATE)/localcluster/build-make.log); its tests will skip"

unit: localcluster-optional

localcluster-status: venv
	@$(LOCALCLUSTER) status

# `make up`: the main job on the embedded default. Control plane, engine, `pulumi up --stack local`
# against it, the burst controller and thermal guard as local processes, then a status summary.
up: venv localcluster
	@$(PY) -m tools.localcluster.stackup up --stack local

down: venv
	@$(PY) -m tools.localcluster.stackup down

# The end-to-end burst scenario on the real components (tests/test_e2e.py).
e2e: venv localcluster
	.venv/bin/pytest -q -p no:xdist tests/test_e2e.py
