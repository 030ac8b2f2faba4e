package testredis

import (
	"os/exec"
	"syscall"
)

// setParentDeathSignal has the kernel kill the server when the thread that
// started it dies.
func setParentDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
