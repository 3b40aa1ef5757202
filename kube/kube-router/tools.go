//go:build tools

// Package tools keeps kube-router's main package in the module graph for `go mod tidy`.
// The binary is built by scripts/build_node.py with `go build <package>`.
package tools

import (
	_ "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router"
)
