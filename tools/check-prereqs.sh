#!/usr/bin/env bash
# What make needs before it starts, each missing piece with its fix on one line.
# Usage: check-prereqs.sh python|go
set -uo pipefail
case "${1:-}" in
  python)
    py=${PYTHON:-python3}
    if ! command -v "$py" >/dev/null; then
      echo "kproxy needs Python 3.11 or newer, and $py is not on PATH: install it (Debian: apt-get install python3 python3-venv) or run make PYTHON=/path/to/python3.11" >&2
      exit 1
    fi
    if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
      echo "kproxy needs Python 3.11 or newer; $py is $("$py" -V 2>&1): install a newer one, or run make PYTHON=/path/to/python3.11" >&2
      exit 1
    fi
    if ! "$py" -c 'import venv, ensurepip' 2>/dev/null; then
      echo "$py has no venv/ensurepip module: install it (Debian: apt-get install python3-venv)" >&2
      exit 1
    fi
    ;;
  go)
    need=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$(dirname "$0")/envtest/go.mod")
    if ! command -v go >/dev/null; then
      echo "building the local cluster needs Go $need or newer, and go is not on PATH: install Go (https://go.dev/doc/install), or set KPROXY_ENVTEST_BIN_DIR to a directory of prebuilt binaries" >&2
      exit 1
    fi
    have=$(go env GOVERSION | sed 's/^go//')
    if [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1)" != "$need" ]; then
      echo "building the local cluster needs Go $need or newer; go on PATH is $have: install a newer Go (https://go.dev/doc/install)" >&2
      exit 1
    fi
    ;;
  *) echo "usage: check-prereqs.sh python|go" >&2; exit 2 ;;
esac
