//go:build tools

// host-device, the reference CNI plugin that moves a whole host network interface into the
// pod's network namespace (and back on DEL), for the device-plugin networking e2e
// (tests/e2e/multus). Given runtimeConfig.deviceID it looks the PCI function up under
// /sys/bus/pci/devices/<id>/net/. This file only pins the program, which
// scripts/go_build_cached.sh builds from go.mod's version of containernetworking/plugins.
package tools

import _ "github.com/containernetworking/plugins/plugins/main/host-device"
