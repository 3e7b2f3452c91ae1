#!/usr/bin/env bash
# The HTTP/1.1 edge's tests against the newest aiohttp release, when it is not the pinned one:
# the edge reaches into aiohttp's internals (kproxy.server.listener.AIOHTTP_SEAM), so a release
# is checked before the pin moves (docs/developing/architecture.md#the-aiohttp-seam).
# Usage: run.sh VENV_BIN CACHE_DIR
set -euo pipefail
bin=$1
cache=$2
pinned=$("$bin/python" -c 'import aiohttp; print(aiohttp.__version__)')
newest=$("$bin/pip" index versions aiohttp --disable-pip-version-check 2>/dev/null | sed -n 's/^aiohttp (\(.*\))$/\1/p' || true)
if [ -z "$newest" ]; then
  echo "aiohttp-newest: WARNING: the package index did not answer: the edge was not tried on the newest aiohttp" >&2
  exit 0
fi
if [ "$newest" = "$pinned" ]; then
  echo "aiohttp-newest: the newest aiohttp release is the pinned one ($pinned): the suite runs on it"
  exit 0
fi
venv="$cache/aiohttp-newest/$newest"
if [ ! -x "$venv/bin/pytest" ]; then
  echo "aiohttp-newest: installing kproxy with aiohttp $newest (pinned: $pinned) into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -e '.[dev]'
  "$venv/bin/pip" install -q --disable-pip-version-check "aiohttp==$newest"
fi
echo "aiohttp-newest: the HTTP/1.1 edge's tests on aiohttp $newest (pinned: $pinned)"
"$venv/bin/pytest" -q -p no:cacheprovider tests/unit/server \
  tests/e2e/test_proxy_http_malformed.py tests/e2e/test_edge_limits.py tests/e2e/test_proxy_http.py \
  tests/e2e/test_upgrade_splice.py
