//go:build !linux

package redisstore

import "os/exec"

// dieWithParentThread does nothing off Linux: there the test's cleanup alone
// stops the cluster node.
func dieWithParentThread(*exec.Cmd) {}
