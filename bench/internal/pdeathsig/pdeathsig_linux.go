// Package pdeathsig ties a child process's life to the thread that starts
// it, so that a benchmark or test binary that crashes leaves no redis-server
// or service behind.
package pdeathsig

import (
	"os/exec"
	"syscall"
)

// Set has the kernel send cmd's process SIGKILL when the OS thread that
// starts it dies. Go ends a thread only when a goroutine locked to it
// (runtime.LockOSThread) returns still locked: start cmd from a goroutine
// that keeps its thread, or locks none, until the process is stopped.
func Set(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
