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
images: images-tools localcluster
	@python3 -m tools.images local

images-upstream:
	@python3 -m tools.images build

images-check:
	@python3 -m tools.images check
