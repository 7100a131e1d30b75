package main

import (
	"os/exec"
	"runtime"
	"syscall"
)

// sysProcAttr puts CMD in a process group of its own and asks the kernel
// to SIGKILL it when the thread that started it ends: the spawner's thread,
// which lives as long as the process, so when leaderfeed dies (kill -9
// included), CMD dies too.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// spawner starts processes from one goroutine locked to its OS thread for
// good. Linux ties the parent-death signal to the thread that forked the
// child, not to the process: a child started from a thread that the Go
// runtime later retires would be killed then. The locked thread is never
// retired while its goroutine lives, and the goroutine lives as long as
// the process.
type spawner struct {
	reqs chan spawnReq
}

type spawnReq struct {
	cmd   *exec.Cmd
	reply chan error
}

func newSpawner() *spawner {
	s := &spawner{reqs: make(chan spawnReq)}
	go func() {
		runtime.LockOSThread() // never unlocked: the thread must outlive every child
		for req := range s.reqs {
			req.reply <- req.cmd.Start()
		}
	}()
	return s
}

func (s *spawner) start(cmd *exec.Cmd) error {
	reply := make(chan error, 1)
	s.reqs <- spawnReq{cmd: cmd, reply: reply}
	return <-reply
}
