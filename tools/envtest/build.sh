#!/usr/bin/env bash
# Build the local cluster's binaries from their Go modules into OUT_DIR.
# Usage: build.sh OUT_DIR                  everything (VERSION is written last)
#        build.sh --only "NAME..." OUT_DIR  just those binaries (a cache built before they existed)
#
# From tools/envtest (the Kubernetes release pinned there as k8s.io/kubernetes, stamped into each binary so
# /version and kubectl report it): etcd, kube-apiserver, kubectl, kube-controller-manager, kube-scheduler, and
# standin-kubelet (./standin-kubelet: the kubelet's exec/attach/port-forward endpoints with the kubelet's own
# streaming code). From tools/kwok: kwok (sigs.k8s.io/kwok), which simulates nodes and pod lifecycles without a
# container runtime, with its stage definitions gathered into kwok-stages.yaml.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=buildlib.sh
. "$here/buildlib.sh"
all="etcd kube-apiserver kubectl kube-controller-manager kube-scheduler standin-kubelet kwok"
only=
if [ "${1:-}" = --only ]; then only=${2:?usage: build.sh --only "NAME..." OUT_DIR}; shift 2; fi
out=${1:?usage: build.sh [--only "NAME..."] OUT_DIR}
for b in $only; do
  case " $all " in *" $b "*) ;; *) echo "build.sh: --only takes names from: $all (not $b)" >&2; exit 2 ;; esac
done
want=${only:-$all}
mkdir -p "$out"
out=$(cd "$out" && pwd)
tmp=$(mktemp -d "$out/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

cd "$here"
k8s=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
ld=$(k8s_ldflags "$k8s")
pkgs=()
for b in $want; do
  case $b in
    etcd | standin-kubelet) pkgs+=("./$b") ;;
    kwok) ;;
    *) pkgs+=("k8s.io/kubernetes/cmd/$b") ;;
  esac
done
if [ ${#pkgs[@]} -gt 0 ]; then
  echo "build.sh: go build ${pkgs[*]} ($k8s)"
  gobuild -trimpath -ldflags "$ld" -o "$tmp/" "${pkgs[@]}"
fi

case " $want " in
  *" kwok "*)
    cd "$here/../kwok"
    kwok=$(go list -m -f '{{.Version}}' sigs.k8s.io/kwok)
    echo "build.sh: go build sigs.k8s.io/kwok/cmd/kwok ($kwok)"
    gobuild -trimpath -ldflags "-s -w" -o "$tmp/" sigs.k8s.io/kwok/cmd/kwok
    # The module's directory is known once it is downloaded (the build above did; a cold cache has none before).
    kwokdir=$(go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)
    [ -n "$kwokdir" ] || { echo "build.sh: sigs.k8s.io/kwok not in the module cache after its build" >&2; exit 1; }
    # Nodes: initialised Ready, heartbeats through Leases. Pods: the general lifecycle (created, init containers,
    # Ready, Job pods Completed, deletions finished).
    stages=("$kwokdir"/kustomize/stage/node/fast/node-initialize.yaml
      "$kwokdir"/kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml
      "$kwokdir"/kustomize/stage/pod/general/pod-*.yaml)
    for f in "${stages[@]}"; do printf -- '---\n'; sed '/^---$/d' "$f"; done > "$tmp/kwok-stages.yaml"
    echo "$kwok" > "$tmp/KWOK_VERSION"
    ;;
esac

for f in "$tmp"/*; do mv -f "$f" "$out/"; done
[ -n "$only" ] || echo "$k8s" > "$out/VERSION"
