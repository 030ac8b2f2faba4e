package redisstore

import (
	"os/exec"
	"syscall"
)

// dieWithParentThread has the kernel kill cmd's process when the thread that
// started it dies, so a crashed test binary leaves no cluster node behind.
func dieWithParentThread(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
