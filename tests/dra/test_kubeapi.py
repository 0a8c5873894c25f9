"""The driver's API client (plugin/kube/client.py) against the stand-in API server over real HTTP(S).

What a user would notice: a field of our slices that the client dropped on
the way (the scheduler would never see it), an API error the publisher or the
claim preparer cannot tell apart (404 vs 409), a driver that stops working
when the kubelet rotates its service account token, a start-up error that
does not say what is missing.
"""

from __future__ import annotations

import copy
import pathlib
import ssl

import pytest
from apiserver_standin import write_kubeconfig

from plugin.kube import KubeApiUnreachable, KubeConflict, KubeError, KubeForbidden, KubeInvalid, KubeNotFound
from plugin.kube.client import KubeApiError, KubeConfigError, in_cluster_api, kubeconfig_api
from plugin.dra.slices.publisher import SlicePublisher
from plugin.dra.slices.build import SliceOptions, build_resource_slices

NODE = "node-a"
TLS = pathlib.Path(__file__).resolve().parent / "tls"
SERVER_SET = ("uid", "resourceVersion", "generation")


def _without_server_fields(s: dict) -> dict:
    s = copy.deepcopy(s)
    for k in SERVER_SET:
        s["metadata"].pop(k, None)
    for d in s["spec"].get("devices", ()):
        for t in d.get("taints", ()):
            t.pop("timeAdded", None)
    return s


async def test_every_field_we_build_reaches_the_api_server_and_comes_back(apiserver, kube_api, dgx_h100):
    topology = dgx_h100.with_health({"GPU3": "Unhealthy"})
    want = build_resource_slices(topology, SliceOptions(node_name=NODE), node_uid=apiserver.node_uid(NODE))
    answers = [await kube_api.create_slice(s) for s in want]
    assert [_without_server_fields(apiserver.slices[s["metadata"]["name"]]) for s in want] == want
    assert [_without_server_fields(a) for a in answers] == want
    listed = await kube_api.list_slices(NODE, "topo.dev")
    assert [_without_server_fields(s) for s in listed] == want
    assert await kube_api.list_slices("node-b", "topo.dev") == []
    assert await kube_api.list_slices(NODE, "gpu.nvidia.com") == []


async def test_api_errors_carry_the_http_status_and_reason(apiserver, kube_api):
    with pytest.raises(KubeApiError) as e:
        await kube_api.get_claim("team", "missing")
    assert (e.value.status, e.value.reason) == (404, "NotFound")
    assert 'resourceclaims.resource.k8s.io "missing" not found' in str(e.value)
    await kube_api.delete_slice("never-there")  # deleting what is gone is no error
    # A proxy in between may add a charset to the Content-Type: still the same error.
    apiserver.content_type = "application/json; charset=utf-8"
    with pytest.raises(KubeApiError) as e:
        await kube_api.node_uid("node-b")
    assert (e.value.status, e.value.reason) == (404, "NotFound")


async def test_a_stale_resource_version_is_a_409_conflict(apiserver, kube_api, dgx_h100):
    [s] = build_resource_slices(dgx_h100, SliceOptions(node_name=NODE))
    created = await kube_api.create_slice(s)
    with pytest.raises(KubeApiError) as e:
        await kube_api.create_slice(s)
    assert (e.value.status, e.value.reason) == (409, "AlreadyExists")
    s["metadata"]["resourceVersion"] = created["metadata"]["resourceVersion"] + "0"
    with pytest.raises(KubeApiError) as e:
        await kube_api.replace_slice(s)
    assert (e.value.status, e.value.reason) == (409, "Conflict")



async def test_each_failure_is_one_type_of_the_one_error_model_with_the_servers_message(apiserver, kube_api, dgx_h100):
    """What a caller branches on (try later, gone, changed under us, our RBAC, what we sent) is the exception's
    type, decided once in plugin/kube: the same for the DRA driver, node labels and the NRT publisher."""
    with pytest.raises(KubeNotFound) as e:
        await kube_api.get_claim("team", "missing")
    assert not e.value.retryable and e.value.message == 'resourceclaims.resource.k8s.io "missing" not found'
    [s] = build_resource_slices(dgx_h100, SliceOptions(node_name=NODE))
    await kube_api.create_slice(s)
    with pytest.raises(KubeConflict) as e:
        await kube_api.create_slice(s)
    assert e.value.retryable and e.value.reason == "AlreadyExists"
    nameless = copy.deepcopy(s)
    nameless["metadata"]["name"] = ""
    with pytest.raises(KubeInvalid, match="422 Invalid: metadata.name: Required value") as e:
        await kube_api.create_slice(nameless)
    assert not e.value.retryable
    apiserver.refuse_node_patches = 1
    with pytest.raises(KubeApiError) as e:
        await kube_api.patch_node_labels(NODE, {"example.com/x": "y"})
    assert type(e.value) is KubeApiError and e.value.status == 503 and e.value.retryable
    await kube_api.patch_node_labels(NODE, {"example.com/x": "y"})  # served once the server is ready
    assert apiserver.nodes[NODE]["metadata"]["labels"]["example.com/x"] == "y"
    apiserver.token = "rotated"
    with pytest.raises(KubeForbidden, match="401 Unauthorized") as e:
        await kube_api.list_slices(NODE, "topo.dev")
    assert not e.value.retryable
    assert all(issubclass(k, KubeError) for k in (KubeApiError, KubeApiUnreachable, KubeConfigError))

@pytest.fixture
def service_account(tmp_path, monkeypatch):
    """A pod's service account directory and the environment the kubelet gives a pod."""
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text("token-1\n", encoding="utf-8")
    (sa / "namespace").write_text("topo-system", encoding="utf-8")
    (sa / "ca.crt").write_bytes((TLS / "ca.crt").read_bytes())
    return sa


@pytest.fixture
async def tls_apiserver(apiserver, monkeypatch):
    """The stand-in again, over TLS with the test CA's server certificate, wanting a bearer token."""
    await apiserver.stop()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(TLS / "server.crt", TLS / "server.key")
    url = await apiserver.start(ssl_context=ctx)
    host, port = url.removeprefix("https://").rsplit(":", 1)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", port)
    apiserver.token = "token-1"
    return apiserver


async def test_in_cluster_the_service_account_token_is_sent_and_reread_when_rotated(
        tls_apiserver, service_account, dgx_h100):
    api = await in_cluster_api(str(service_account))
    try:
        pub = SlicePublisher(api, SliceOptions(node_name=NODE))
        pub._topology = dgx_h100
        assert await pub.reconcile() is True
        assert set(tls_apiserver.authorizations) == {"Bearer token-1"}
        # The kubelet rotates the projected token; the old one stops working.
        (service_account / "token").write_text("token-2\n", encoding="utf-8")
        tls_apiserver.token = "token-2"
        tls_apiserver.authorizations.clear()
        pub._topology = dgx_h100.with_health({"GPU0": "Unhealthy"})
        assert await pub.reconcile() is True
        assert tls_apiserver.authorizations[:2] == ["Bearer token-1", "Bearer token-2"]  # 401, then again
        assert set(tls_apiserver.authorizations[2:]) == {"Bearer token-2"}
    finally:
        await api.close()


async def test_in_cluster_the_api_server_certificate_is_checked_against_the_service_account_ca(
        tls_apiserver, service_account):
    (service_account / "ca.crt").write_bytes((TLS / "server.crt").read_bytes())  # not the CA that signed it
    api = await in_cluster_api(str(service_account))
    try:
        with pytest.raises(Exception) as e:
            await api.node_uid(NODE)
        assert "CERTIFICATE_VERIFY_FAILED" in repr(e.value) or "certificate verify failed" in str(e.value)
        assert tls_apiserver.authorizations == []  # no token went to a server we could not verify
    finally:
        await api.close()


async def test_a_kubeconfig_with_a_token_file_talks_tls_to_the_server_it_names(tls_apiserver, tmp_path):
    (tmp_path / "token").write_text("token-1", encoding="utf-8")
    path = write_kubeconfig(tmp_path / "kubeconfig", tls_apiserver.url, {"tokenFile": str(tmp_path / "token")},
                            ca=str(TLS / "ca.crt"))
    api = await kubeconfig_api(path)
    try:
        assert await api.node_uid(NODE) == tls_apiserver.node_uid(NODE)
    finally:
        await api.close()


async def test_configuration_errors_say_what_is_missing(tmp_path, monkeypatch, service_account):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    with pytest.raises(KubeConfigError, match="KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT not set"):
        await in_cluster_api(str(service_account))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    (service_account / "token").unlink()
    with pytest.raises(KubeConfigError, match=f"in-cluster configuration from {service_account}.*token"):
        await in_cluster_api(str(service_account))
    with pytest.raises(KubeConfigError, match=f"kubeconfig {tmp_path}/nope.*not found"):
        await kubeconfig_api(str(tmp_path / "nope"))
    (tmp_path / "bad").write_text("clusters: [", encoding="utf-8")
    with pytest.raises(KubeConfigError, match=f"kubeconfig {tmp_path}/bad"):
        await kubeconfig_api(str(tmp_path / "bad"))


async def test_no_answer_at_all_is_told_apart_from_an_error_answer(tmp_path):
    """A stopped API server: `KubeApiUnreachable` naming the server, so the claim preparer fails fast."""
    from apiserver_standin import ApiServerStandIn

    from plugin.kube.client import KubeApiUnreachable

    server = ApiServerStandIn(NODE)
    url = await server.start()
    api = await kubeconfig_api(write_kubeconfig(tmp_path / "kubeconfig", url))
    try:
        with pytest.raises(KubeApiError) as e:
            await api.get_claim("team", "missing")
        assert e.value.status == 404
        await server.stop()
        with pytest.raises(KubeApiUnreachable, match=f"the API server at {url} is unreachable \\(no connection"):
            await api.get_claim("team", "missing")
    finally:
        await api.close()


async def _claim(apiserver) -> str:
    return apiserver.add_claim("team", "c", [{"request": "gpu", "driver": "topo.dev", "pool": NODE,
                                              "device": "gpu-0"}])


async def test_claim_reads_share_one_kept_alive_connection(apiserver, kube_api):
    """Issue 24: a claim read does not pay for a new connection (a TCP and TLS handshake) each time."""
    uid = await _claim(apiserver)
    for _ in range(5):
        assert (await kube_api.get_claim("team", "c"))["metadata"]["uid"] == uid
    assert list(apiserver.connections.values()) == [5]


async def test_a_connection_the_server_closed_while_idle_is_replaced(apiserver, kube_api):
    uid = await _claim(apiserver)
    await kube_api.get_claim("team", "c")
    assert apiserver.close_idle_connections() == 1
    assert (await kube_api.get_claim("team", "c"))["metadata"]["uid"] == uid
    assert sorted(apiserver.connections.values()) == [1, 1]


async def test_a_read_whose_connection_the_server_closes_under_it_is_sent_again_once(apiserver, kube_api):
    """The server closes a kept-alive connection just as the read arrives on it (no answer at all): the
    read is tried once more on a new connection, and the claim is read, not reported unreachable."""
    uid = await _claim(apiserver)
    await kube_api.get_claim("team", "c")
    apiserver.drop_reused_reads = 1
    assert (await kube_api.get_claim("team", "c"))["metadata"]["uid"] == uid
    assert apiserver.drop_reused_reads == 0, "the read was not sent on the kept-alive connection"
    assert sorted(apiserver.connections.values()) == [1, 2]
    assert apiserver.claim_reads == 2
