#!/usr/bin/env bash
# Build one compatibility minor's control plane from its Go modules into OUT_DIR.
# Usage: build.sh MINOR OUT_DIR     e.g. build.sh v1.36 ~/.cache/kproxy/envtest/v1.36.3
#
# MINOR names a module under tools/compat (go.mod pins k8s.io/kubernetes and replaces its staging modules with
# the published ones of the same release, like tools/envtest/go.mod). Built: kube-apiserver and kubectl of that
# release (its version stamped in, so /version reports it) and etcd at the version that release's go.mod selects
# (go.etcd.io/etcd/server/v3 is etcd's own main package). VERSION is written last: a directory without it is an
# unfinished build. Only the control plane: the living cluster's controllers and KWOK run on the pinned release.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../envtest/buildlib.sh
. "$here/../envtest/buildlib.sh"
minor=${1:?usage: build.sh MINOR OUT_DIR}
out=${2:?usage: build.sh MINOR OUT_DIR}
mod="$here/$minor"
[ -f "$mod/go.mod" ] || { echo "build.sh: no module $mod/go.mod (minors: $(cd "$here" && ls -d v1.*))" >&2; exit 2; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
tmp=$(mktemp -d "$out/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

cd "$mod"
k8s=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
etcd=$(go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)
ld=$(k8s_ldflags "$k8s")

echo "build.sh: go build kube-apiserver kubectl ($k8s)"
gobuild -trimpath -ldflags "$ld" -o "$tmp/" k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl
echo "build.sh: go build etcd ($etcd)"
gobuild -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3
echo "$etcd" > "$tmp/ETCD_VERSION"
for f in "$tmp"/*; do mv -f "$f" "$out/"; done
echo "$k8s" > "$out/VERSION"
