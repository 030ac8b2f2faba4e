//go:build unix && !linux

package testservers

import "syscall"

// sysProcAttr runs a server as cred (nil: as the test binary's user). Off
// Linux there is no parent-death signal: Main and the tests' cleanups alone
// stop the servers.
func sysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred}
}
