#!/usr/bin/env bash
# Build toxiproxy (a TCP proxy that adds latency and bandwidth limits: the WAN benchmark's link) from its Go
# module (through the Go module proxy) into OUT_DIR: toxiproxy-server and toxiproxy-cli.
# Usage: build.sh OUT_DIR
# The release is the one pinned in go.mod (github.com/Shopify/toxiproxy/v2); it is stamped into the binaries
# so `toxiproxy-server -version` reports it, as toxiproxy's own Makefile does for a tag.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: build.sh OUT_DIR}
mkdir -p "$out"
cd "$here"
v=$(go list -m -f '{{.Version}}' github.com/Shopify/toxiproxy/v2)
ld="-s -w -X github.com/Shopify/toxiproxy/v2.Version=${v#v}"
tmp=$(mktemp -d "$out/.build.XXXXXX")
CGO_ENABLED=0 go build -trimpath -ldflags "$ld" -o "$tmp/toxiproxy-server" github.com/Shopify/toxiproxy/v2/cmd/server
CGO_ENABLED=0 go build -trimpath -ldflags "$ld" -o "$tmp/toxiproxy-cli" github.com/Shopify/toxiproxy/v2/cmd/cli
mv -f "$tmp/toxiproxy-server" "$out/toxiproxy-server"
mv -f "$tmp/toxiproxy-cli" "$out/toxiproxy-cli"
rmdir "$tmp"
echo "$v" > "$out/VERSION"
