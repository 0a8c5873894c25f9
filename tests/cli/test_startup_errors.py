"""Start-up without a GPU driver: a clear runtime error (exit 1), or zero GPUs when asked to carry on."""

from __future__ import annotations

from click.testing import CliRunner

from plugin.cli import cli
from topo_testkit.sysfs_fixture import write_demo


def test_nvml_missing_is_exit_1_with_the_fix(no_driver, tmp_path):
    node = write_demo(str(tmp_path / "n"))
    args = ["discover", "--sysfs-root", node.sysfs_root, "--dev-root", node.dev_root, "--proc-root", node.proc_root]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 1
    assert "cannot initialise NVML" in r.output
    # The fix names the real flag (the CLI rejects `--fail-on-init-error=false`), and following it works.
    assert "--no-fail-on-init-error" in r.output and "--fail-on-init-error=false" not in r.output
    r = CliRunner().invoke(cli, [*args, "--no-fail-on-init-error"])
    assert r.exit_code == 0, r.output
    assert "0 GPUs" in r.output and "Resource topo.dev/nic" in r.output
