package main

import (
	"os/exec"
	"syscall"
)

// setParentDeathSignal has the kernel kill the server when the thread that
// started it dies, so a crashed test binary leaves no server behind.
func setParentDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
