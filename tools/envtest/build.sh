#!/usr/bin/env bash
# Build etcd, kube-apiserver and kubectl from their Go modules into OUT_DIR.
# Usage: build.sh OUT_DIR
# The Kubernetes release is the one pinned in go.mod (k8s.io/kubernetes); the
# version is stamped into the binaries so /version and kubectl report it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: build.sh OUT_DIR}
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
CGO_ENABLED=0 go build -trimpath -ldflags "$ld" -o "$tmp/" \
  ./etcd k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl
for b in etcd kube-apiserver kubectl; do mv -f "$tmp/$b" "$out/$b"; done
rmdir "$tmp"
echo "$k8s" > "$out/VERSION"
