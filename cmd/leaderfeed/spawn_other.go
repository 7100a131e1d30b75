//go:build !linux

package main

import (
	"os/exec"
	"syscall"
)

// guarded reports whether CMD runs under a guard on this system: only on
// Linux (see spawn_linux.go). Elsewhere CMD is leaderfeed's own child and
// survives a kill -9 of leaderfeed.
const guarded = false

// sysProcAttr puts CMD in a process group of its own.
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

type spawner struct{}

func newSpawner() *spawner { return &spawner{} }

func (*spawner) command(path, argv0 string, args []string) *exec.Cmd {
	cmd := exec.Command(path, args...)
	cmd.Args[0] = argv0
	return cmd
}

// start starts cmd and returns CMD's pid.
func (*spawner) start(cmd *exec.Cmd) (func(), int, error) {
	if err := cmd.Start(); err != nil {
		return nil, 0, err
	}
	return func() {}, cmd.Process.Pid, nil
}

func guardMain([]string) int { return exitUsage }
