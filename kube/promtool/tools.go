//go:build tools

// Package tools keeps promtool's main package in the module graph for `go mod tidy`.
package tools

import _ "github.com/prometheus/prometheus/cmd/promtool"
