//go:build !linux

package main

import "os/exec"

// setParentDeathSignal does nothing off Linux: there run alone stops the
// services.
func setParentDeathSignal(*exec.Cmd) {}
