"""A bare HTTPS GET with urllib, no Kubernetes client in between: for tests that compare the exact
status and Status body kproxy and the apiserver answer a caller with or without a bearer token."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path


def get_json(url: str, ca_file: Path | None, token: str | None = None) -> tuple[int, dict[str, object]]:
    """(status, decoded JSON body) of ``GET url``, an error status included."""
    ctx = ssl.create_default_context(cafile=str(ca_file)) if ca_file else None
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
