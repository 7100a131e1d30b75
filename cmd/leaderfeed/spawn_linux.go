package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
)

// On Linux CMD does not run as leaderfeed's own child but under a guard:
// leaderfeed re-executes itself (/proc/self/exe, so a binary replaced on
// disk since does not matter) as "leaderfeed __guard PATH ARGV...", in a
// process group of its own, and the guard starts CMD in that group. The
// guard holds the read end of a pipe whose write end only leaderfeed
// holds. When leaderfeed dies, in whatever way (kill -9 included), the
// kernel closes the write end, the guard reads EOF and sends SIGKILL to the
// whole group: CMD and every process it started that stayed in its group.
// A parent-death signal alone (which the guard also sets on CMD, in case
// the guard itself is killed) reaches only CMD, not what CMD started.
//
// SIGTERM, SIGINT and SIGHUP sent to the group reach CMD itself; the guard
// takes them without dying, waits for CMD and exits with CMD's status
// (128+N when signal N ended it).

// guardArg is the hidden first argument that makes leaderfeed a guard.
const guardArg = "__guard"

// guardFd is the guard's end of the pipe: the first of cmd.ExtraFiles.
// pidFd, the second, is where the guard writes CMD's pid, one line, once
// CMD has started (and nothing if it could not start it).
const (
	guardFd = 3
	pidFd   = 4
)

// guarded reports whether CMD runs under a guard on this system.
const guarded = true

// sysProcAttr puts the guard in a process group of its own (CMD joins it).
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

// spawner starts CMD's guard.
type spawner struct{}

func newSpawner() *spawner { return &spawner{} }

// command returns the command that runs path (argv[0] argv0) with args
// under a guard.
func (*spawner) command(path, argv0 string, args []string) *exec.Cmd {
	cmd := exec.Command("/proc/self/exe", append([]string{guardArg, path, argv0}, args...)...)
	cmd.Args[0] = "leaderfeed" // ps shows "leaderfeed __guard PATH ARGV..."
	return cmd
}

// start starts cmd (from command) with the guard's pipes and returns the
// pid of CMD itself (0 if the guard could not start it). The returned
// function closes leaderfeed's end; call it once the guard has exited.
func (*spawner) start(cmd *exec.Cmd) (func(), int, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, 0, fmt.Errorf("guard pipe: %w", err)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		_ = r.Close()
		_ = w.Close()
		return nil, 0, fmt.Errorf("guard pipe: %w", err)
	}
	defer pr.Close()
	cmd.ExtraFiles = []*os.File{r, pw}
	err = cmd.Start()
	_ = r.Close() // the guard has its copies
	_ = pw.Close()
	if err != nil {
		_ = w.Close()
		return nil, 0, err
	}
	// The guard writes the pid right after starting CMD, or exits: EOF.
	line, _ := bufio.NewReader(pr).ReadString('\n')
	pid, _ := strconv.Atoi(strings.TrimSpace(line))
	return func() { _ = w.Close() }, pid, nil
}

// guardMain is the guard: args are PATH ARGV0 ARGS...
func guardMain(args []string) int {
	if len(args) < 2 {
		fmt.Fprintln(os.Stderr, "leaderfeed: the guard is started by leaderfeed run, not by hand")
		return exitUsage
	}
	parent := os.NewFile(guardFd, "leaderfeed")
	pidOut := os.NewFile(pidFd, "leaderfeed-pid")
	if parent == nil || pidOut == nil {
		fmt.Fprintln(os.Stderr, "leaderfeed: guard: no pipe from leaderfeed")
		return exitUsage
	}
	// Neither pipe is CMD's: with the pid pipe open in CMD, leaderfeed
	// would read no EOF if the guard died before writing.
	syscall.CloseOnExec(guardFd)
	syscall.CloseOnExec(pidFd)
	// Handled, not ignored: ignored signals would stay ignored in CMD.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	go func() {
		for range sigs { // CMD got the same signal: wait for it
		}
	}()
	go func() {
		var b [1]byte
		_, _ = parent.Read(b[:]) // EOF: leaderfeed is gone
		_ = syscall.Kill(0, syscall.SIGKILL)
	}()
	// CMD's parent-death signal is tied to the thread that starts it: this
	// one, locked for the guard's life.
	runtime.LockOSThread()
	cmd := exec.Command(args[0], args[2:]...)
	cmd.Args[0] = args[1]
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err := cmd.Start()
	if err == nil {
		fmt.Fprintln(pidOut, cmd.Process.Pid)
	}
	_ = pidOut.Close()
	if err != nil {
		fmt.Fprintf(os.Stderr, "leaderfeed: cannot start CMD %q: %v\n", args[1], err)
		if os.IsNotExist(err) {
			return exitNotFound
		}
		return exitNotExec
	}
	_ = cmd.Wait()
	return exitStatus(cmd.ProcessState)
}
