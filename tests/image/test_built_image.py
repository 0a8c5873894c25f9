"""The image really built here (scripts/build_image.py), checked in containerd.

The unchanged Dockerfile is built with Debian's buildah on a mmdebstrap base, exported as
an OCI archive, imported into a private containerd (in private namespaces, tests/e2e/cluster
sandbox.py) and run with `ctr run` inside containerd's mount namespace: `--version` and
`discover --simulate dgx-a100` answer, as the image's non-root user. The archive itself is
checked for the entry point, user, labels, size and the absence of test doubles.

Needs root, buildah, mmdebstrap and containerd (installed by the project's scripts). Where
they cannot exist here the tests skip with the reason; under TOPO_DP_REQUIRE_CHART_TOOLS=1
or TOPO_DP_REQUIRE_KUBELET_E2E=1 (CI) that is a failure.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
for p in (ROOT / "scripts", ROOT / "tests" / "e2e" / "cluster", ROOT / "tests" / "kubelet"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import build_image

IMAGE_UID = 65532
#: The image with the slim base made here; python:3.11-slim-bookworm alone is about 150 MB.
SIZE_BUDGET_MB = 150

pytestmark = [pytest.mark.timeout(1800), pytest.mark.slow]


def _unavailable(reason: str) -> None:
    if "1" in (os.environ.get("TOPO_DP_REQUIRE_CHART_TOOLS"), os.environ.get("TOPO_DP_REQUIRE_KUBELET_E2E")):
        pytest.fail(f"the image build is required in CI but {reason}")
    print(f"\nSKIP (tests/image built image): {reason}", file=sys.stderr)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def built() -> build_image.Built:
    try:
        result = build_image.build()
    except build_image.Unavailable as e:
        _unavailable(str(e))
    print("\n" + build_image.render_report(result.report), file=sys.stderr)
    return result


@pytest.fixture(scope="module")
def containerd(built, tmp_path_factory):
    """A private containerd with the image imported (stopped by PID afterwards)."""
    import cluster_build
    from kubelet_build import BuildUnavailable
    from sandbox import Sandbox, host_mounts_under

    if os.geteuid() != 0:
        _unavailable("containerd and the namespaces it runs in need root")
    try:
        cluster_build.packages()
        cni = cluster_build.cni_bin_dir()
    except BuildUnavailable as e:
        _unavailable(str(e))
    w = tmp_path_factory.mktemp("image-ctr")
    sb = Sandbox(w)
    try:
        sb.start()
        sb.start_containerd(cni, "registry.k8s.io/pause:3.10")
        sb.import_image(built.archive)
        yield sb
    finally:
        sb.close()
        assert sb.leftovers == [] and host_mounts_under(w) == []


def ctr_run(sb, ref: str, *argv: str, name: str) -> tuple[int, str]:
    proc = sb.ctr("run", "--rm", ref, name, *argv, check=False, timeout=300)
    return proc.returncode, proc.stdout + proc.stderr


def test_containerd_knows_the_image_by_its_name(built, containerd):
    assert built.ref in containerd.ctr("images", "ls", "-q").stdout.split()


def test_the_image_command_names_the_archive_as_the_charts_default_image(built, containerd, tmp_path):
    """`scripts/image.py build --tool offline` gives the chart's default name: a default install finds it."""
    import image

    archive = tmp_path / "topo-device-plugin.tar"
    image.retag(built.archive, archive, image.default_ref())
    containerd.import_image(archive)
    assert image.default_ref() in containerd.ctr("images", "ls", "-q").stdout.split()
    assert image.default_ref() == "localhost/topo-device-plugin:" + image.app_version()
    rc, out = ctr_run(containerd, image.default_ref(), "topo-device-plugin", "--version", name="tdp-retagged")
    assert rc == 0, out


def test_version_through_the_runtime(built, containerd):
    rc, out = ctr_run(containerd, built.ref, "topo-device-plugin", "--version", name="tdp-version")
    assert rc == 0, out
    version = re.search(r'^version\s*=\s*"([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert version in out


def test_discover_runs_as_the_non_root_user(built, containerd):
    rc, out = ctr_run(containerd, built.ref, "sh", "-c",
                      "id -u; id -g; topo-device-plugin discover --simulate dgx-a100 --format json", name="tdp-discover")
    assert rc == 0, out
    uid, gid, rest = out.split("\n", 2)
    assert (int(uid), int(gid)) == (IMAGE_UID, IMAGE_UID)
    data = json.loads(rest)
    assert {r["name"] for r in data["resources"]} >= {"nvidia.com/gpu"}


def test_entrypoint_user_and_labels(built):
    cfg = built.report["config"]
    assert cfg["Entrypoint"] == ["topo-device-plugin"] and cfg["Cmd"] == ["serve"]
    assert cfg["User"] == f"{IMAGE_UID}:{IMAGE_UID}"
    labels = cfg["Labels"]
    version = re.search(r'^version\s*=\s*"([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert labels["org.opencontainers.image.title"] == "topo-device-plugin"
    assert labels["org.opencontainers.image.version"] == version
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["org.opencontainers.image.source"].startswith("https://")


def test_no_test_doubles_in_the_image(built):
    assert built.report["test_doubles"] == [], "test code shipped in the image"


def test_the_hosts_ca_bundle_was_not_baked_in_and_the_venv_has_no_pip(built):
    """The host CA bundle (with this network's proxy CA) was mounted for the build only."""
    import hashlib

    host = hashlib.sha256(Path(build_image.CA_BUNDLE).read_bytes()).hexdigest()
    assert host not in built.report["ca_bundles"]
    assert "opt/topo-device-plugin/bin/topo-device-plugin" in built.report["venv_bin"]
    assert not any(p.startswith("opt/topo-device-plugin/bin/pip") for p in built.report["venv_bin"])


def test_image_size_within_budget(built):
    size_mb = built.report["uncompressed_bytes"] / 1e6
    assert size_mb <= SIZE_BUDGET_MB, build_image.render_report(built.report)
