#!/usr/bin/env bash
# Builds the local control plane into $LOCALCLUSTER_BIN (default .state/localcluster/bin) from four
# modules (., addons, volcano, virtualkubelet) and copies the Volcano CRDs of the pinned module into
# .state/localcluster/crd; then the real nodes' components (kuberouter, coredns) and their monitoring (promoperator:
# prometheus-operator and its config reloader; prometheus: Prometheus; with a stamp of their own; the Prometheus and
# Probe CRDs in crd/prometheus-operator).
# Cached: a stamp holds the hash of every go.mod/go.sum, our mains and the build inputs declared below (Kubernetes
# version, flags, the monitoring CRDs' release); a warm run only hashes. How the script reports progress is no
# part of the key. One binary at a time with -p ${GO_BUILD_P:-2}: the machine is shared with other Go builds;
# each says every 30 s that it is still running (tools/progress.sh). Cold (empty Go cache, 2 cores, the
# engine building beside it): 28m37s idle, 36m53s with other work on the machine.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
state="${LOCALCLUSTER_STATE:-$root/.state/localcluster}"
bin="${LOCALCLUSTER_BIN:-$state/bin}"
crd="$state/crd"
par="${GO_BUILD_P:-2}"

# The Kubernetes release the core module pins (go.mod); reported by the API server's /version.
k8s_version="v1.35.3"
core=(etcd kube-apiserver kube-controller-manager kube-scheduler)
addons=(kwok descheduler)
volcano=(vc-scheduler vc-controller-manager)
# The real nodes' components (kubelet, kube-proxy, our fake GPU device plugin) from the core module, built
# after the control plane with a stamp of their own: a run that ends inside them leaves the control plane usable.
# apiproxy (ours, standard library only) stands between the pods and the API server for the chaos soak's network faults.
node=(kubelet kube-proxy fake-gpu-plugin pause kube-router coredns apiproxy)
# kube-router's firewall (the NetworkPolicy engine of the real nodes), from the module kuberouter/go.mod pins.
router_pkg="github.com/cloudnativelabs/kube-router/v2/cmd/kube-router"
# The real nodes' cluster DNS (CoreDNS with its kubernetes plugin), from the module coredns/go.mod pins.
dns_pkg="github.com/coredns/coredns"
# The upstream command itself (its built-in mock provider), from the module virtualkubelet/go.mod pins.
vk=(virtual-kubelet)
vk_pkg="github.com/virtual-kubelet/virtual-kubelet/cmd/virtual-kubelet"
# The real nodes' monitoring (tools/localcluster/prometheus_operator.py): prometheus-operator, its config reloader and
# Prometheus at the release the operator is built on, from the modules promoperator/go.mod and prometheus/go.mod pin.
# A stamp of their own, keyed on those modules alone: adding or bumping one rebuilds these three binaries, not the
# control plane.
promop=(prometheus-operator prometheus-config-reloader prometheus)
promop_pkg="github.com/prometheus-operator/prometheus-operator/cmd"
prom_pkg="github.com/prometheus/prometheus/cmd/prometheus"
# The CRDs only the operator needs (the three the stack declares are in crd/ for every cluster).
promop_crds=(prometheuses probes)
# Every upstream release comes from the pin table (components/pins.py, standard library only): the go.mod
# files below must require what it pins, so the e2e runs the releases a stack deploys.
(cd "$root" && "${PYTHON:-python3}" -m components.pins check)
prom_operator="$(cd "$root" && "${PYTHON:-python3}" -m components.pins ref prometheus-operator)"

# Build inputs besides the Go sources; every one of them is part of the stamp's key (a new input goes here).
go_flags="-trimpath"
strip="-s -w"
key() {
  (cd "$here" && find . \( -path ./promoperator -o -path ./prometheus \) -prune -o \
     \( -name go.mod -o -name go.sum -o -name '*.go' \) -print0 \
    | LC_ALL=C sort -z | xargs -0 sha256sum
   printf '%s\n' "$prom_operator" "k8s_version=$k8s_version" "go_flags=$go_flags" "strip=$strip") \
    | sha256sum | cut -d' ' -f1
}
promop_key() {
  (cd "$here" && sha256sum promoperator/go.mod promoperator/go.sum prometheus/go.mod prometheus/go.sum
   printf '%s\n' "$prom_operator" "crds=${promop_crds[*]}" "go_flags=$go_flags" "strip=$strip") \
    | sha256sum | cut -d' ' -f1
}

want="$(key)"
have="$(cat "$bin/.stamp" 2>/dev/null || true)"
complete=1
for b in "${core[@]}" "${addons[@]}" "${volcano[@]}" "${vk[@]}"; do [ -x "$bin/$b" ] || complete=0; done
[ -s "$crd/scheduling.volcano.sh_podgroups.yaml" ] && [ -s "$crd/monitoring.coreos.com_servicemonitors.yaml" ] || complete=0
node_complete=1
for b in "${node[@]}"; do [ -x "$bin/$b" ] || node_complete=0; done
node_have="$(cat "$bin/.node-stamp" 2>/dev/null || true)"
promop_want="$(promop_key)"
promop_have="$(cat "$bin/.promoperator-stamp" 2>/dev/null || true)"
promop_complete=1
for b in "${promop[@]}"; do [ -x "$bin/$b" ] || promop_complete=0; done
for c in "${promop_crds[@]}"; do [ -s "$crd/prometheus-operator/monitoring.coreos.com_$c.yaml" ] || promop_complete=0; done
if [ "$want" = "$have" ] && [ "$complete" = 1 ] && [ "$want" = "$node_have" ] && [ "$node_complete" = 1 ] \
   && [ "$promop_want" = "$promop_have" ] && [ "$promop_complete" = 1 ]; then
  echo "localcluster: binaries up to date in $bin"
  exit 0
fi

mkdir -p "$bin" "$crd"
minor="${k8s_version#v1.}"; minor="${minor%%.*}"
version_flags="-X k8s.io/component-base/version.gitVersion=$k8s_version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
build() { # module-dir name extra-ldflags [package, default ./cmd/<name>]
  local start=$SECONDS
  bash "$root/tools/progress.sh" "localcluster: building $2" -- \
    go -C "$1" build -p "$par" $go_flags -ldflags "$strip $3" -o "$bin/$2.tmp" "${4:-./cmd/$2}"
  mv "$bin/$2.tmp" "$bin/$2"
  echo "localcluster: built $2 in $((SECONDS - start))s"
}
total=$SECONDS
if [ "$want" != "$have" ] || [ "$complete" != 1 ]; then
rm -f "$bin/.stamp" "$bin/.node-stamp"
echo "localcluster: building from Go modules into $bin (cold: about 35 min on 2 cores from an empty Go cache; warm: seconds)"
# kwok right after the Kubernetes components: with it the cluster is usable while Volcano builds.
for b in kube-apiserver kube-controller-manager kube-scheduler etcd; do build "$here" "$b" "$version_flags"; done
build "$here/addons" kwok ""
vk_version="$(cd "$here/virtualkubelet" && go list -m -f '{{.Version}}' github.com/virtual-kubelet/virtual-kubelet)"
build "$here/virtualkubelet" virtual-kubelet "-X main.buildVersion=$vk_version" "$vk_pkg"
for b in "${volcano[@]}"; do build "$here/volcano" "$b" ""; done
build "$here/addons" descheduler ""

# Every CRD Volcano's scheduler and controllers watch (their informers wait for all of them).
volcano_dir="$(cd "$here/volcano" && go list -m -f '{{.Dir}}' volcano.sh/volcano)"
rm -f "$crd"/*.yaml
install -m 0644 "$volcano_dir"/config/crd/volcano/bases/*.yaml "$crd/"
# The monitoring CRDs a production cluster gets from prometheus-operator: the stack declares
# ServiceMonitors and PrometheusRules. Fetched (checksum-verified) from the module proxy.
prom_dir="$(cd "$here" && go mod download -json "$prom_operator" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
for c in servicemonitors podmonitors prometheusrules; do
  install -m 0644 "$prom_dir/example/prometheus-operator-crd/monitoring.coreos.com_$c.yaml" "$crd/"
done
echo "$want" > "$bin/.stamp"
echo "localcluster: built the control plane in $((SECONDS - total))s"
fi

# The real nodes (tools/localcluster/nodes.py): kubelet and kube-proxy at the API server's version.
if [ "$want" != "$node_have" ] || [ "$node_complete" != 1 ]; then
node_start=$SECONDS
rm -f "$bin/.node-stamp"
build "$here" kubelet "$version_flags"
build "$here" kube-proxy "$version_flags"
build "$here" fake-gpu-plugin ""
CGO_ENABLED=0 build "$here" pause ""
build "$here" apiproxy ""
build "$here/kuberouter" kube-router "" "$router_pkg"
build "$here/coredns" coredns "" "$dns_pkg"
echo "$want" > "$bin/.node-stamp"
echo "localcluster: built the real nodes' components in $((SECONDS - node_start))s"
fi

# prometheus-operator (cmd/operator), cmd/prometheus-config-reloader and Prometheus of the pinned releases, each
# reporting its release (upstream stamps prometheus/common's version package the same way), and the CRDs only the
# operator needs. Cold (empty Go cache, 2 cores, two other Go builds beside it): the operator 421 s, the reloader 7 s
# after it, Prometheus 119 s after those (its module shares part of their build cache).
if [ "$promop_want" != "$promop_have" ] || [ "$promop_complete" != 1 ]; then
promop_start=$SECONDS
rm -f "$bin/.promoperator-stamp"
promop_version="$(cd "$here/promoperator" && go list -m -f '{{.Version}}' github.com/prometheus-operator/prometheus-operator)"
promop_flags="-X github.com/prometheus/common/version.Version=${promop_version#v}"
build "$here/promoperator" prometheus-operator "$promop_flags" "$promop_pkg/operator"
build "$here/promoperator" prometheus-config-reloader "$promop_flags" "$promop_pkg/prometheus-config-reloader"
# Upstream tags Prometheus 3.MINOR.PATCH as module v0.3MINOR.PATCH (components/pins.py prometheus_release).
prom_module="$(cd "$here/prometheus" && go list -m -f '{{.Version}}' github.com/prometheus/prometheus)"
prom_minor="${prom_module#v0.}"; prom_minor="${prom_minor%%.*}"
prom_release="$((prom_minor / 100)).$((prom_minor % 100)).${prom_module##*.}"
build "$here/prometheus" prometheus "-X github.com/prometheus/common/version.Version=$prom_release" "$prom_pkg"
promop_dir="$(cd "$here/promoperator" && go list -m -f '{{.Dir}}' github.com/prometheus-operator/prometheus-operator)"
mkdir -p "$crd/prometheus-operator"
rm -f "$crd/prometheus-operator"/*.yaml
for c in "${promop_crds[@]}"; do
  install -m 0644 "$promop_dir/example/prometheus-operator-crd/monitoring.coreos.com_$c.yaml" "$crd/prometheus-operator/"
done
echo "$promop_want" > "$bin/.promoperator-stamp"
echo "localcluster: built prometheus-operator $promop_version and Prometheus $prom_release in $((SECONDS - promop_start))s"
fi
echo "localcluster: everything in $((SECONDS - total))s"
