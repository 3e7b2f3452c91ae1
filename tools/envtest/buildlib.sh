# Shared by tools/envtest/build.sh and tools/compat/build.sh (sourced, not run).

# k8s_ldflags VERSION: -ldflags that stamp a Kubernetes release into a binary, so /version and kubectl report it.
k8s_ldflags() {
  local k8s=$1 minor now ld="-s -w"
  minor=$(echo "$k8s" | cut -d. -f2)
  now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $p.gitVersion=$k8s -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=$now"
  done
  echo "$ld"
}

# gobuild ARGS...: go build with a line of progress every 20 s (a cold build is quiet for minutes otherwise);
# its own output is shown only if it fails. Uses $tmp (the caller's scratch directory) for its log.
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
  rm -f "$log"
  echo "build.sh:   done in $((SECONDS - started)) s"
}
