#!/usr/bin/env bash
# Builds the real Pulumi engine of the project from Go modules into .state/engine/bin:
#   pulumi                        the CLI (github.com/pulumi/pulumi/pkg/v3/cmd/pulumi)
#   pulumi-language-python        the project's Python language host (cli/cmd/pulumi-language-python)
#   pulumi-language-python-exec   the SDK's launcher script, copied from the sdk module
#   pulumi-language-yaml          the YAML language host (yaml/go.mod), for YAML programs using our package
# and into .state/engine/providers:
#   pulumi-resource-kubernetes    the Kubernetes provider (kubernetes/cmd/pulumi-resource-kubernetes)
#   pulumi-resource-random        our RandomInteger-only stand-in (cli/cmd/pulumi-resource-random)
# A stamp keyed on what the binaries are made of (the Go version, the go.mod/go.sum files and our
# sources, and the build inputs declared below: versions, flags, the schema step) makes a warm run a
# no-op; how this script reports its progress is no part of it. Exit 0 when the engine is ready;
# non-zero with a one-line reason otherwise. Each Go build says every 30 s that it is still running
# (tools/progress.sh). Cold (empty Go cache, 2 cores, the local cluster building beside it): 29m23s idle,
# 36m16s with other work on the machine.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
OUTDIR="${ENGINE_DIR:-$ROOT/.state/engine}"
BIN="$OUTDIR/bin"
# Providers stay off PATH: the engine would otherwise take them as ambient plugins of any version.
PROV="$OUTDIR/providers"
STAMP="$OUTDIR/stamp"
# Modest parallelism: the build machine has 2 cores shared with other work.
JOBS="${ENGINE_BUILD_JOBS:-2}"

# The Kubernetes provider module is served only at one pseudo-version; this is the release
# label of that commit (the matching PyPI pre-release is pulumi_kubernetes 4.25.0a1768448096).
K8S_VERSION="4.25.0-alpha.1768448096"
# Our stand-in for the random provider (cli/cmd/pulumi-resource-random): the upstream provider module
# is not served. It implements RandomInteger only; the label says it is not the upstream 4.21.4.
RANDOM_VERSION="4.21.4-unifiedgpu.1"

# Build inputs besides the Go sources; every one of them is part of the stamp's key (a new input goes here).
GO_FLAGS="-trimpath"
STRIP="-s -w"
PULUMI_VERSION_VAR="github.com/pulumi/pulumi/sdk/v3/go/common/version.Version"
YAML_VERSION_VAR="github.com/pulumi/pulumi-yaml/pkg/version.Version"
K8S_VERSION_VAR="github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/version.Version"
# Generate step of the Kubernetes provider: the committed schema with the version stamped in, as the
# provider's release does. Arguments: source schema, destination, version.
GEN_SCHEMA='
import json, sys
src, dst, version = sys.argv[1:]
with open(src, encoding="utf-8") as f:
    spec = json.load(f)
spec["version"] = version
with open(dst, "w", encoding="utf-8") as f:
    json.dump(spec, f, separators=(",", ":"))
'
PROGRESS="$ROOT/tools/progress.sh"

command -v go >/dev/null || { echo "engine: go is not installed" >&2; exit 3; }

key() {
  {
    go version
    printf '%s\n' "K8S_VERSION=$K8S_VERSION" "RANDOM_VERSION=$RANDOM_VERSION" "GO_FLAGS=$GO_FLAGS" "STRIP=$STRIP" \
      "PULUMI_VERSION_VAR=$PULUMI_VERSION_VAR" "YAML_VERSION_VAR=$YAML_VERSION_VAR" \
      "K8S_VERSION_VAR=$K8S_VERSION_VAR" "$GEN_SCHEMA"
    find "$HERE/cli" "$HERE/kubernetes" "$HERE/yaml" \( -name build -prune \) -o -type f \
      \( -name '*.go' -o -name go.mod -o -name go.sum \) -print | LC_ALL=C sort | xargs cat
  } | sha256sum | cut -d' ' -f1
}

want="$(key)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]] \
  && [[ -x "$BIN/pulumi" && -x "$BIN/pulumi-language-python" && -x "$BIN/pulumi-language-python-exec" \
        && -x "$BIN/pulumi-language-yaml" \
        && -x "$PROV/pulumi-resource-kubernetes" && -x "$PROV/pulumi-resource-random" ]]; then
  echo "engine: up to date ($BIN)"
  exit 0
fi

mkdir -p "$BIN" "$PROV"
rm -f "$STAMP"
export GOFLAGS="-mod=readonly -buildvcs=false"
start=$(date +%s)

pulumi_version="$(cd "$HERE/cli" && go list -m -f '{{.Version}}' github.com/pulumi/pulumi/pkg/v3)"
ldv="-X $PULUMI_VERSION_VAR=$pulumi_version"
# go -C <module dir> build …, under the heartbeat.
gobuild() { local what="$1" dir="$2"; shift 2; bash "$PROGRESS" "engine: building $what" -- go -C "$dir" build -p "$JOBS" $GO_FLAGS "$@"; }

echo "engine: building pulumi $pulumi_version (cold: about 35 min on 2 cores from an empty Go cache; warm: seconds)"
gobuild pulumi "$HERE/cli" -ldflags "$STRIP $ldv" -o "$BIN/pulumi" github.com/pulumi/pulumi/pkg/v3/cmd/pulumi
gobuild pulumi-language-python "$HERE/cli" -ldflags "$STRIP $ldv" -o "$BIN/pulumi-language-python" \
  ./cmd/pulumi-language-python
gobuild pulumi-resource-random "$HERE/cli" -ldflags "$STRIP -X main.Version=$RANDOM_VERSION" \
  -o "$PROV/pulumi-resource-random" ./cmd/pulumi-resource-random
printf '%s\n' "$RANDOM_VERSION" > "$PROV/pulumi-resource-random.version"
yaml_version="$(cd "$HERE/yaml" && go list -m -f '{{.Version}}' github.com/pulumi/pulumi-yaml)"
echo "engine: building pulumi-language-yaml $yaml_version"
gobuild pulumi-language-yaml "$HERE/yaml" -ldflags "$STRIP -X $YAML_VERSION_VAR=${yaml_version#v}" \
  -o "$BIN/pulumi-language-yaml" github.com/pulumi/pulumi-yaml/cmd/pulumi-language-yaml
sdk_dir="$(cd "$HERE/cli" && go list -m -f '{{.Dir}}' github.com/pulumi/pulumi/sdk/v3)"
install -m 0755 "$sdk_dir/python/cmd/pulumi-language-python-exec" "$BIN/pulumi-language-python-exec"

echo "engine: building pulumi-resource-kubernetes $K8S_VERSION"
bash "$PROGRESS" "engine: downloading the Kubernetes provider module" -- \
  go -C "$HERE/kubernetes" mod download github.com/pulumi/pulumi-kubernetes/provider/v4
k8s_dir="$(cd "$HERE/kubernetes" && go list -m -f '{{.Dir}}' github.com/pulumi/pulumi-kubernetes/provider/v4)"
gen="$HERE/kubernetes/cmd/pulumi-resource-kubernetes/build"
mkdir -p "$gen"
python3 -c "$GEN_SCHEMA" "$k8s_dir/cmd/pulumi-resource-kubernetes/schema.json" "$gen/schema.json" "$K8S_VERSION"
install -m 0644 "$k8s_dir/cmd/pulumi-resource-kubernetes/terraform-mapping.json" "$gen/terraform-mapping.json"
gobuild pulumi-resource-kubernetes "$HERE/kubernetes" -ldflags "$STRIP -X $K8S_VERSION_VAR=$K8S_VERSION" \
  -o "$PROV/pulumi-resource-kubernetes" ./cmd/pulumi-resource-kubernetes

printf '%s\n' "$K8S_VERSION" > "$PROV/pulumi-resource-kubernetes.version"
echo "$want" > "$STAMP"
echo "engine: built in $(( $(date +%s) - start ))s into $OUTDIR"
