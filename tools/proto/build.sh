#!/usr/bin/env bash
# Build kproxy's Kubernetes protobuf schema (make proto):
#  1. `go mod download` fetches k8s.io/api, apimachinery, apiextensions-apiserver and kube-aggregator
#     (versions pinned in go.mod, the control plane's release) from the Go module proxy;
#  2. grpcio-tools' protoc compiles every generated.proto into one FileDescriptorSet
#     (kproxy/codec/data/kubernetes.binpb);
#  3. jsontags reads the same packages' Go json tags (kproxy/codec/data/kubernetes-json.json),
#     which decide Kubernetes' JSON shape (omitempty, inline, null) where the .proto is silent.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
python="${PYTHON:-$repo/.venv/bin/python}"
out="$repo/kproxy/codec/data"
mods=(k8s.io/api k8s.io/apimachinery k8s.io/apiextensions-apiserver k8s.io/kube-aggregator)
cd "$here"
export GOFLAGS=-mod=mod
go mod download "${mods[@]}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/k8s.io"
dirs=()
for m in "${mods[@]}"; do
  dir="$(go list -m -f '{{.Dir}}' "$m")"
  ln -s "$dir" "$work/$m"
  dirs+=("$dir")
done
mkdir -p "$out"
(cd "$work" && find -L k8s.io -name generated.proto | sort > files.txt)
(cd "$work" && "$python" -m grpc_tools.protoc -I. --include_imports \
  --descriptor_set_out="$out/kubernetes.binpb" $(cat files.txt)) 2> >(grep -v 'is unused' >&2)
go run ./jsontags "$work/tags.json" "${dirs[@]}"
"$python" -c 'import json,sys; json.dump(json.load(open(sys.argv[1])), open(sys.argv[2], "w"), separators=(",", ":"), sort_keys=True)' \
  "$work/tags.json" "$out/kubernetes-json.json"
echo "proto: $(wc -l < "$work/files.txt") generated.proto files -> $out/kubernetes.binpb ($(stat -c %s "$out/kubernetes.binpb") bytes), kubernetes-json.json ($(stat -c %s "$out/kubernetes-json.json") bytes)"
