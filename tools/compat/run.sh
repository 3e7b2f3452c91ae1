#!/usr/bin/env bash
# The compatibility run: for each older supported minor (a module under tools/compat, or those named), build its
# etcd, kube-apiserver and kubectl if the cache lacks them, then run the focused e2e set (tests.txt) against a
# control plane of that minor, one control plane per minor, started and stopped by pytest.
# Usage: run.sh [MINOR...]    e.g. run.sh v1.36     (default: every tools/compat/v1.* module)
# Environment: PYTEST (default .venv/bin/pytest), KPROXY_CACHE (default ~/.cache/kproxy), PYTEST_ARGS.
# Results: a JUnit file per minor in .cache/compat/<version>.xml; the exit code is non-zero if any minor failed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cache=${KPROXY_CACHE:-$HOME/.cache/kproxy}
pytest=${PYTEST:-$root/.venv/bin/pytest}
minors=("$@")
if [ ${#minors[@]} -eq 0 ]; then
  for d in "$here"/v1.*/; do minors+=("$(basename "$d")"); done
fi
mapfile -t tests < <(sed -e 's/#.*//' -e 's/[[:space:]]*$//' "$here/tests.txt" | grep .)
mkdir -p "$root/.cache/compat"
cd "$root"

summary=()
failed=0
for minor in "${minors[@]}"; do
  mod="$here/$minor/go.mod"
  [ -f "$mod" ] || { echo "compat: no module $mod" >&2; exit 2; }
  # The pin, as the Makefile and kproxy.localcluster.binaries read it from go.mod.
  version=$(sed -n 's|^\s*k8s.io/kubernetes \(v[0-9][0-9.]*\).*|\1|p' "$mod" | head -1)
  bin="$cache/envtest/$version"
  if [ "$(cat "$bin/VERSION" 2>/dev/null)" != "$version" ]; then
    bash "$here/../check-prereqs.sh" go
    echo "compat: building etcd, kube-apiserver, kubectl $version into $bin (cold: about 8 CPU-minutes)"
    time nice -n 10 bash "$here/build.sh" "$minor" "$bin"
  fi
  echo "compat: $version (etcd $(cat "$bin/ETCD_VERSION" 2>/dev/null || echo '?')): ${#tests[@]} test ids from tools/compat/tests.txt"
  rc=0
  # KPROXY_ENVTEST_DIR unset: never reuse a running control plane of the pinned release.
  env -u KPROXY_ENVTEST_DIR KPROXY_ENVTEST_BIN_DIR="$bin" \
    "$pytest" -q -ra -p no:cacheprovider --junitxml="$root/.cache/compat/$version.xml" \
    ${PYTEST_ARGS:-} "${tests[@]}" || rc=$?
  if [ $rc -eq 0 ]; then summary+=("  $version: passed"); else summary+=("  $version: FAILED (pytest exit $rc)"); failed=1; fi
done

echo
echo "compat: results ($(date -u +%Y-%m-%d))"
printf '%s\n' "${summary[@]}"
exit $failed
