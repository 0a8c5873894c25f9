//go:build tools

// Multus (thin plugin) for the device-plugin networking e2e (tests/e2e/multus): the CNI
// meta-plugin that reads a NetworkAttachmentDefinition's k8s.v1.cni.cncf.io/resourceName,
// asks the kubelet's pod-resources API which device IDs the container holds and hands one to
// each delegate CNI (as runtimeConfig.deviceID and pciBusID). Nothing of ours is compiled in:
// this file only pins the program, which scripts/go_build_cached.sh builds as
// `go build gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus` from go.mod's version.
package tools

import _ "gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus"
