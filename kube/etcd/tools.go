//go:build tools

// Package tools keeps etcd's main package in the module graph for `go mod tidy`.
package tools

import _ "go.etcd.io/etcd/server/v3"
