//go:build !linux

package main

import "os/exec"

// setParentDeathSignal does nothing off Linux: there TestMain alone stops the
// server.
func setParentDeathSignal(*exec.Cmd) {}
