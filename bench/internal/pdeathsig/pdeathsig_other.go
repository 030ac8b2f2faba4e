//go:build !linux

// Package pdeathsig ties a child process's life to the thread that starts
// it, on Linux; elsewhere the caller alone stops its children.
package pdeathsig

import "os/exec"

// Set does nothing off Linux: there whoever started cmd alone stops it.
func Set(*exec.Cmd) {}
