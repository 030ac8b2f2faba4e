package testservers

import "syscall"

// sysProcAttr runs a server as cred (nil: as the test binary's user) and
// has the kernel kill it when the thread that started it dies (see spawn).
func sysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Credential: cred}
}
