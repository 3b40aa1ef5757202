//go:build tools

// Package tools keeps the CNI plugins' main packages in the module graph for `go mod tidy`.
// The binaries are built by scripts/build_node.py with `go build <package>`.
package tools

import (
	_ "github.com/containernetworking/plugins/plugins/ipam/host-local"
	_ "github.com/containernetworking/plugins/plugins/main/bridge"
	_ "github.com/containernetworking/plugins/plugins/main/loopback"
)
