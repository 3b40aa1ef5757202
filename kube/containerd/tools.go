//go:build tools

// Package tools keeps containerd's main packages in the module graph for `go mod tidy`.
// The binaries are built by scripts/build_node.py with `go build <package>`.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
