//go:build !linux

package testredis

import "os/exec"

// setParentDeathSignal does nothing off Linux: there Main alone stops the
// server.
func setParentDeathSignal(*exec.Cmd) {}
