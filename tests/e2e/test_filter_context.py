"""A filter started by a real server gets a context whose ApiClient talks to the real apiserver
with kproxy's own credentials, whatever the callers' mode."""

from __future__ import annotations

from typing import ClassVar

import aiohttp
import pytest
from multidict import CIMultiDict

from kproxy.config import parse_config
from kproxy.core.chain import BytesBody, Exchange, FilterBase, Handler, Reply
from kproxy.localcluster.certs import ADMIN_COMMON_NAME
from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.server.kubeconfig import from_kubeconfig
from kproxy.server.proxy import ProxyServer


class WhoAmI(FilterBase):
    """Answers /whoami itself by asking the apiserver (a SelfSubjectReview) with its own credentials."""

    name: ClassVar[str] = "whoami"

    async def __call__(self, ex: Exchange, call_next: Handler) -> Reply:
        if ex.raw_path != "/whoami":
            return await call_next(ex)
        assert self.ctx is not None
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        code, review = await self.ctx.api.json("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", body)
        user = review["status"]["userInfo"]["username"] if code == 201 else f"error {code}"
        return Reply(200, CIMultiDict({"Content-Type": "text/plain"}), BytesBody(user.encode()))


@pytest.mark.parametrize("mode", ["proxy", "forward"])
async def test_filter_context_uses_kproxy_own_credentials(control_plane: ControlPlaneInfo, mode: str) -> None:
    cfg = parse_config({"listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0", "credentials": mode})
    server = ProxyServer(cfg, from_kubeconfig(str(control_plane.admin_kubeconfig), None), [WhoAmI()])
    await server.start()
    try:
        assert server.bound is not None
        host, port = server.bound
        async with aiohttp.ClientSession() as s, s.get(f"http://{host}:{port}/whoami") as resp:
            text = await resp.text()
        # The caller sent no credentials at all; the filter's own call was made as kproxy's admin.
        assert (resp.status, text) == (200, ADMIN_COMMON_NAME)
        assert server.context.credentials == mode
    finally:
        await server.shutdown(1.0)
