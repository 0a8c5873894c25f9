//go:build tools

// Multus (thin plugin) for the networking e2e (tests/e2e/multus): the CNI meta-plugin that reads
// a NetworkAttachmentDefinition's k8s.v1.cni.cncf.io/resourceName, finds the device IDs the pod
// holds under that name and hands one to each delegate CNI (as runtimeConfig.deviceID and
// pciBusID). Two sources of device IDs: the kubelet's pod-resources API (device plugins) and,
// since multus-cni PR #1492, the pod's DRA claims (pkg/draclient: each allocated device's
// `k8s.cni.cncf.io/resourceName` and `k8s.cni.cncf.io/deviceID` attributes in its ResourceSlice).
//
// That PR was merged (commit 7235e831c, 2026-07-08) after Multus's last tag, v4.3.0, and the Go
// module proxy here serves no later version, so the build takes v4.3.0 from the proxy and applies
// multus-pr1492.patch: `git diff v4.3.0 7235e831c` of the Go sources cmd/multus compiles (the six
// non-test files under pkg/ that changed; nothing else changed there), which reproduces the
// commit's sources exactly. go.mod is unchanged between the two, hence the replace of the module by
// the patched copy (./src, made beside a copy of this directory by tests/e2e/multus/conftest.py).
// Nothing of ours is compiled in.
package tools

import _ "gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus"
