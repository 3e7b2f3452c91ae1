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
n=$(echo "$k8s" | cut -d. -f2)
now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
ld="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ld="$ld -X $p.gitVersion=$k8s -X $p.gitMajor=1 -X $p.gitMinor=$n -X $p.gitTreeState=clean -X $p.buildDate=$now"
done

# go build with a line of progress every 20 s (a cold build is quiet for minutes); its output only on failure.
gobuild() {
  local log="$tmp/go-build.log" started=$SECONDS rc=0
  : > "$log"
  ( while sleep 20; do
      echo "build.sh:   ... $(grep -c '^[a-z]' "$log" 2>/dev/null || true) packages compiled, $((SECONDS - started)) s"
    done ) &
  local ticker=$!
  CGO_ENABLED=0 go build -v "$@" 2>"$log" || rc=$?
  kill "$ticker" 2>/dev/null; wait "$ticker" 2>/dev/null || true
  if [ $rc -ne 0 ]; then tail -n 60 "$log" >&2; return $rc; fi
  echo "build.sh:   done in $((SECONDS - started)) s"
}

echo "build.sh: go build kube-apiserver kubectl ($k8s)"
gobuild -trimpath -ldflags "$ld" -o "$tmp/" k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl
echo "build.sh: go build etcd ($etcd)"
gobuild -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3
rm -f "$tmp/go-build.log"
echo "$etcd" > "$tmp/ETCD_VERSION"
for f in "$tmp"/*; do mv -f "$f" "$out/"; done
echo "$k8s" > "$out/VERSION"
