# The agents' container images (agents/*/Dockerfile; each base is a build argument whose default is pinned by
# digest). `make images` builds every one here without a registry or a daemon (buildah on a Python base built
# locally with debootstrap, tools/image_local.py) into .state/images/oci, which the local cluster's real nodes
# import. `make images-upstream` builds them on their pinned upstream bases with docker, podman or buildah where
# a registry is reachable. CI builds and pushes them (.github/workflows/agent-images.yml) and records the pushed
# digests in components/agent_digests.json (docs/ci.md). `make images-check` is the pinning check alone.
.PHONY: images images-upstream images-check images-tools

images-tools:
	@command -v debootstrap >/dev/null && command -v umoci >/dev/null && command -v buildah >/dev/null || \
	  $(call apt_install,debootstrap umoci buildah)

# The pause binary comes from the local cluster's build (tools/localcluster/cmd/pause).
images: images-tools localcluster observability-tools
	@python3 -m tools.images local

images-upstream:
	@python3 -m tools.images build

images-check:
	@python3 -m tools.images check

# Before the unit tests: the images the real-node e2e runs (tests/test_e2e_realnodes.py), when this machine can
# build them; otherwise one line says why and those tests skip. Cold: the Python base (debootstrap, about 3.5 min)
# and each agent image (a pip install in its RUN step, 1-2.5 min); warm: every image is cached by its Dockerfile and
# the files it copies (tools/image_local.py), seconds. IMAGES_BUILD_BUDGET_S caps a run for CI's 90 minutes.
IMAGES_BUILD_BUDGET_S ?= 1200
.PHONY: images-optional
images-optional: images-tools
	@if [ ! -x $(STATE)/localcluster/bin/pause ]; then echo "images: the pause binary is not built (make localcluster); the real-node tests will skip"; \
	  else timeout $(IMAGES_BUILD_BUDGET_S) python3 -m tools.images local; rc=$$?; \
	    if [ $$rc = 124 ]; then echo "images: build passed its $(IMAGES_BUILD_BUDGET_S)s budget; the real-node tests will skip"; \
	    elif [ $$rc != 0 ]; then echo "images: not built on this machine (exit $$rc, log $(STATE)/images/build.log); the real-node tests will skip"; fi; fi

unit: images-optional
