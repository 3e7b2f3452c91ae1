"""A small validating admission webhook of the tests' own, served over TLS from the test process.

The apiserver calls it for the objects of one namespace (``namespaceSelector``), so it cannot
affect other tests. It records every AdmissionReview it gets and refuses dry runs: the way a
webhook that cannot run side-effect free shows up to a client, which must reach the client
through kproxy exactly as it does directly.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from aiohttp import web

from kproxy.localcluster import certs
from kproxy.localcluster.processes import free_ports

REFUSAL = "this webhook refuses dry runs"


class DryRunRefusingWebhook:
    """Denies every request whose AdmissionReview says ``dryRun: true``; allows the rest."""

    def __init__(self, tmp: Path) -> None:
        self.port = free_ports(1)[0]
        self.reviews: list[dict[str, Any]] = []
        ca = certs.generate_ca("kproxy-test-webhook-ca")
        leaf = certs.generate_serving_cert(ca, ("127.0.0.1",), "webhook")
        self.ca_bundle = base64.b64encode(ca.cert_pem).decode()
        cert = certs.write_pem(tmp / "webhook.crt", leaf.cert_pem, private=False)
        key = certs.write_pem(tmp / "webhook.key", leaf.key_pem, private=True)
        self._ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._ssl.load_cert_chain(cert, key)
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    async def _review(self, request: web.Request) -> web.Response:
        review = await request.json()
        req = review["request"]
        self.reviews.append(req)
        allowed = not req.get("dryRun", False)
        response: dict[str, Any] = {"uid": req["uid"], "allowed": allowed}
        if not allowed:
            response["status"] = {"code": 403, "message": REFUSAL}
        return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/validate", self._review)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=self._ssl).start()

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def configuration(self, name: str, namespace: str, side_effects: str = "None") -> dict[str, Any]:
        """A ValidatingWebhookConfiguration sending this namespace's ConfigMap writes here."""
        return {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [
                {
                    "name": f"{name}.kproxy.test",
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": side_effects,
                    "failurePolicy": "Fail",
                    "timeoutSeconds": 10,
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                    "rules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE", "UPDATE", "DELETE"],
                            "resources": ["configmaps"],
                        }
                    ],
                    "clientConfig": {"url": f"https://127.0.0.1:{self.port}/validate", "caBundle": self.ca_bundle},
                }
            ],
        }


@contextmanager
def running_webhook(tmp: Path) -> Iterator[DryRunRefusingWebhook]:
    hook = DryRunRefusingWebhook(tmp)
    hook.start()
    try:
        yield hook
    finally:
        hook.stop()
