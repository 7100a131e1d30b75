//go:build !linux

package main

import (
	"os/exec"
	"syscall"
)

// sysProcAttr puts CMD in a process group of its own. Outside Linux there
// is no parent-death signal: CMD survives a kill -9 of leaderfeed.
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

type spawner struct{}

func newSpawner() *spawner { return &spawner{} }

func (*spawner) start(cmd *exec.Cmd) error { return cmd.Start() }
