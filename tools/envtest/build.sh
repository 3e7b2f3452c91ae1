#!/usr/bin/env bash
# Build etcd, kube-apiserver, kubectl and standin-kubelet from their Go modules into OUT_DIR.
# Usage: build.sh OUT_DIR                       everything (VERSION is written last)
#        build.sh --only standin-kubelet OUT_DIR  just the stand-in kubelet (a cache built before it existed)
# standin-kubelet (./standin-kubelet) serves the kubelet's exec/attach/port-forward endpoints with the
# kubelet's own streaming code, so exec and port-forward run end to end without a kubelet.
# The Kubernetes release is the one pinned in go.mod (k8s.io/kubernetes); the
# version is stamped into the binaries so /version and kubectl report it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
only=
if [ "${1:-}" = --only ]; then only=${2:?usage: build.sh --only standin-kubelet OUT_DIR}; shift 2; fi
out=${1:?usage: build.sh [--only standin-kubelet] OUT_DIR}
case "$only" in "" | standin-kubelet) ;; *) echo "build.sh: --only takes standin-kubelet, not $only" >&2; exit 2 ;; esac
mkdir -p "$out"
cd "$here"
k8s=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
minor=$(echo "$k8s" | cut -d. -f2)
pkg=k8s.io/component-base/version
cgo=k8s.io/client-go/pkg/version
now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
ld="-s -w"
for p in $pkg $cgo; do
  ld="$ld -X $p.gitVersion=$k8s -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=$now"
done
tmp=$(mktemp -d "$out/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
if [ -n "$only" ]; then
  CGO_ENABLED=0 go build -trimpath -ldflags "$ld" -o "$tmp/" ./standin-kubelet
  mv -f "$tmp/standin-kubelet" "$out/standin-kubelet"
  exit 0
fi
CGO_ENABLED=0 go build -trimpath -ldflags "$ld" -o "$tmp/" \
  ./etcd ./standin-kubelet k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl
for b in etcd standin-kubelet kube-apiserver kubectl; do mv -f "$tmp/$b" "$out/$b"; done
echo "$k8s" > "$out/VERSION"
