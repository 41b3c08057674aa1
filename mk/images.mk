# The agents' container images (agents/*/Dockerfile, bases pinned by digest). `make images` builds them with
# docker, podman or buildah when one can build here, tagged as the stack deploys them; with none it says so and
# exits 3. CI builds and pushes them (.github/workflows/agent-images.yml) and records the pushed digests in
# components/agent_digests.json (docs/ci.md). `make images-check` is the pinning check alone.
.PHONY: images images-check

images:
	@python3 -m tools.images build

images-check:
	@python3 -m tools.images check
