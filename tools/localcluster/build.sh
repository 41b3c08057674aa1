#!/usr/bin/env bash
# Builds the local control plane binaries into $LOCALCLUSTER_BIN (default .state/localcluster/bin).
# Cached: a stamp holds the hash of every go.mod/go.sum and our mains; a warm run only hashes and exits.
# One binary at a time with -p ${GO_BUILD_P:-2}: the machine is shared with other Go builds.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="${LOCALCLUSTER_BIN:-$root/.state/localcluster/bin}"
par="${GO_BUILD_P:-2}"
k8s_version="v1.36.1"

# module dir -> binaries built from its cmd/<name>
core=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok descheduler)
volcano=(vc-scheduler vc-controller-manager)

key() {
  (cd "$here" && find . -name go.mod -o -name go.sum -o -name '*.go' -o -name build.sh | LC_ALL=C sort | xargs sha256sum) | sha256sum | cut -d' ' -f1
}

want="$(key)"
have="$(cat "$bin/.stamp" 2>/dev/null || true)"
missing=0
for b in "${core[@]}" "${volcano[@]}"; do [ -x "$bin/$b" ] || missing=1; done
if [ "$want" = "$have" ] && [ "$missing" = 0 ]; then
  echo "localcluster: binaries up to date in ${bin#$root/}"
  exit 0
fi

mkdir -p "$bin"
rm -f "$bin/.stamp"
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$k8s_version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=36 -X k8s.io/component-base/version.gitTreeState=clean -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z"
build() { # module-dir name
  local start=$SECONDS
  (cd "$1" && go build -p "$par" -trimpath -ldflags "$ldflags" -o "$bin/$2" "./cmd/$2")
  echo "localcluster: built $2 in $((SECONDS - start))s"
}
total=$SECONDS
for b in "${core[@]}"; do build "$here" "$b"; done
for b in "${volcano[@]}"; do build "$here/volcano" "$b"; done
echo "$want" > "$bin/.stamp"
echo "localcluster: all binaries built in $((SECONDS - total))s"
