// Command testchild is the CMD of the end-to-end tests of leaderfeed run.
// It takes a PostgreSQL advisory lock (an independent check that two
// children never run at once: a second child cannot take it while the first
// holds it), writes a line "start TERM NODE PID UNIXNANO lock=BOOL" (the
// time it was started, before it connected) to
// DIR/TERM-PID.log, starts a grandchild ("sleep 3600", its pid in a line
// "grandchild TERM NODE PID UNIXNANO"), waits for SIGTERM, then appends "end TERM NODE PID
// UNIXNANO" and exits 0.
//
//	testchild DIR POSTGRES_URL LOCK_KEY
package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

func main() {
	began := time.Now() // the start line gives this: when CMD was started, before it connects
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: testchild DIR POSTGRES_URL LOCK_KEY")
		os.Exit(2)
	}
	dir, url := os.Args[1], os.Args[2]
	key, err := strconv.ParseInt(os.Args[3], 10, 64)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testchild:", err)
		os.Exit(2)
	}
	term, node := os.Getenv("LEADERFEED_TERM"), os.Getenv("LEADERFEED_NODE")
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testchild:", err)
		os.Exit(1)
	}
	var locked bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", key).Scan(&locked); err != nil {
		fmt.Fprintln(os.Stderr, "testchild:", err)
		os.Exit(1)
	}
	f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("%s-%d.log", term, os.Getpid())), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testchild:", err)
		os.Exit(1)
	}
	// A grandchild in CMD's process group, which leaderfeed must not leave
	// running when it dies: its pid goes into the log with the start line.
	grandchild := exec.Command("sleep", "3600")
	if err := grandchild.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "testchild:", err)
		os.Exit(1)
	}
	fmt.Fprintf(f, "start %s %s %d %d lock=%t\ngrandchild %s %s %d %d\n", term, node, os.Getpid(), began.UnixNano(), locked,
		term, node, grandchild.Process.Pid, time.Now().UnixNano())
	<-sigs
	fmt.Fprintf(f, "end %s %s %d %d\n", term, node, os.Getpid(), time.Now().UnixNano())
	_ = f.Close()
	_ = conn.Close(context.Background())
}
