//go:build tools

// Package tools keeps Kueue's main package in the module graph for `go mod tidy`.
package tools

import _ "sigs.k8s.io/kueue/cmd/kueue"
