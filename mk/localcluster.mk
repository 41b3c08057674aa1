# The local control plane (issue 8): etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# kwok, Volcano and the descheduler built from Go modules into $(STATE)/localcluster/bin and run as
# local processes on 127.0.0.1. tools/localcluster/build.sh keeps a stamp keyed on go.mod/go.sum and
# our mains, so a warm `make localcluster` takes seconds.
.PHONY: localcluster localcluster-optional localcluster-tools up down localcluster-status e2e

LOCALCLUSTER := tools/localcluster/localcluster

# openssl makes the cluster's certificates; the guard keeps a machine that has it from touching apt.
localcluster-tools:
	@command -v openssl >/dev/null || $(call apt_install,openssl)
	@# The real nodes' runtime and network (tools/localcluster/nodehost.py), all from Debian.
	@command -v containerd >/dev/null && command -v runc >/dev/null && test -x /usr/lib/cni/bridge && \
	  command -v iptables-save >/dev/null || \
	  $(call apt_install,containerd runc containernetworking-plugins iptables ipset conntrack iproute2)
	@command -v go >/dev/null || { echo "localcluster: needs Go >= 1.26 on PATH (go.mod of tools/localcluster)"; exit 1; }

localcluster: localcluster-tools
	@mkdir -p $(STATE)/localcluster
	@bash tools/localcluster/build.sh

# Before the unit tests: build if this machine can; when it cannot, say so in one line and go on
# (tests/test_localcluster.py then skips with the reason).
# A cold build took 28m37s on 2 cores (empty Go cache, the engine building beside it) before the real nodes; with
# them, on a fresh machine: 2929 s (control plane 2225 s, the real nodes' components 339 s, prometheus-operator and
# Prometheus 365 s; the engine's 2118 s beside it). A warm run takes seconds. LOCALCLUSTER_BUILD_BUDGET_S caps it per run so `make test` (engine + local cluster + tests) stays
# inside CI's 90 minutes. The Go cache keeps the progress. Output goes to the log; every 30 s a line says
# the build is still running, with the log's last line.
LOCALCLUSTER_BUILD_BUDGET_S ?= 1800
localcluster-optional:
	@mkdir -p $(STATE)/localcluster
	@: > $(STATE)/localcluster/build-make.log; \
	  timeout $(LOCALCLUSTER_BUILD_BUDGET_S) $(PROGRESS) --log $(STATE)/localcluster/build-make.log "localcluster: building (cold: about 35 min on 2 cores; log $(STATE)/localcluster/build-make.log)" -- $(MAKE) --no-print-directory localcluster; rc=$$?; \
	  if [ $$rc = 0 ]; then tail -n 1 $(STATE)/localcluster/build-make.log; \
	  elif [ $$rc = 124 ]; then echo "localcluster: build passed its $(LOCALCLUSTER_BUILD_BUDGET_S)s budget in this run; its tests will skip (the Go cache keeps the progress for the next run)"; \
	  else echo "localcluster: not built on this machine (see $(STATE)/localcluster/build-make.log); its tests will skip"; fi


localcluster-status: venv
	@$(LOCALCLUSTER) status

# `make up`: the main job on the embedded default. Control plane, engine, `pulumi up --stack local`
# against it, the burst controller and health guard as local processes, then a status summary. With
# REAL_NODES=1 the system node and three GPU nodes are real kubelets (docs/real-nodes.md), the agents run as the pods
# `pulumi up` deploys, from the images `make images` builds, and prometheus-operator's Prometheus, in a pod, scrapes them.
# The engine is your own `pulumi` when one at or above the SDK's version is on PATH (then only the
# control plane is built), else the project's build; ENGINE=built or ENGINE=path chooses (tools/engine_select.py).
up: venv
	@kind=$$($(PY) -m tools.engine_select --kind) || exit 2; \
	  if [ "$$kind" = path ]; then $(MAKE) --no-print-directory localcluster; else $(MAKE) --no-print-directory go-builds; fi
	@$(if $(REAL_NODES),$(MAKE) --no-print-directory images observability-tools &&) $(PY) -m tools.localcluster.stackup up --stack local $(if $(REAL_NODES),--real-nodes)

down: venv
	@$(PY) -m tools.localcluster.stackup down

# The end-to-end scenarios on the real components (tests/test_e2e*.py: burst and faults, researchers, provider rank),
# and the small scale shape's (tests/test_scale_cluster.py: gangs placed by the fabric, fault storms, a leaf switch
# down and its release).
e2e: venv localcluster engine observability-tools images
	.venv/bin/pytest -q -p no:xdist tests/test_e2e.py tests/test_e2e_researcher.py tests/test_e2e_provider_rank.py tests/test_e2e_realnodes.py tests/test_e2e_stack_in_pods.py tests/test_scale_cluster.py
