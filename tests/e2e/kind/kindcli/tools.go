//go:build tools

// Package tools pins the kind CLI (sigs.k8s.io/kind) for scripts/go_build_cached.sh.
package tools

import _ "sigs.k8s.io/kind"
