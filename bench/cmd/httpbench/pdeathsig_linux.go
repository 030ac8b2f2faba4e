package main

import (
	"os/exec"
	"syscall"
)

// setParentDeathSignal has the kernel kill the child when the thread that
// started it dies, so a crashed httpbench leaves no service behind. run
// keeps that thread for the goroutine that starts and stops the services
// (runtime.LockOSThread).
func setParentDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
