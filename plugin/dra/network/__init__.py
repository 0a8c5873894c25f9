"""A claim's NICs: the `NicConfig` checked in prepare and each NIC's pod interface (`nic_config.py`, pure), the
conflicts with other prepared claims (`conflicts.py`, pure), and the NRI sandbox handler that moves prepared NICs
into their pod's network namespace and back (`pod_network.py`)."""
