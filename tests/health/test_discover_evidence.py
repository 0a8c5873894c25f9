"""`discover` on a real node (the NVML double) prints what the driver says each GPU needs."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from topo_testkit.with_fake_nvml import fake_for, installed

from plugin.cli import cli


@pytest.mark.parametrize("field", [True, False], ids=["field", "no-field"])
def test_discover_prints_each_gpus_recovery_action_and_pending_repairs(tmp_path, field):
    fake = fake_for("dgx-a100", recovery_field=field)
    sysfs = fake.write_sysfs(str(tmp_path / "sys"))
    fake.set_health_facts("GPU1", recovery_action=1, remap_pending=True, volatile_dbe=2)
    fake.set_health_facts("GPU2", retired_pending=True)
    with installed(fake):
        r = CliRunner().invoke(cli, ["discover", "--sysfs-root", sysfs, "--no-fail-on-init-error"])
    assert r.exit_code == 0, r.output
    section = r.output[r.output.index("GPU health from the driver"):].splitlines()
    rows = {line.split()[0]: line for line in section[2:] if line.strip()}
    assert section[1].split() == ["GPU", "RECOVERY", "ACTION", "ROW", "REMAP", "RETIRED", "PAGES", "VOLATILE", "DBE"]
    if field:
        assert "1 (GPU reset)" in rows["GPU1"] and "0 (none)" in rows["GPU0"]
    else:
        assert rows["GPU1"].split()[1] == "n/a" and rows["GPU0"].split()[1] == "n/a"
    assert "pending (reset needed)" in rows["GPU1"] and rows["GPU1"].split()[-1] == "2"
    assert rows["GPU2"].count("pending (reset needed)") == 1 and rows["GPU0"].split()[-3:] == ["no", "no", "0"]
