//go:build linux

package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgPair is a PostgreSQL primary with one streaming standby, both private
// clusters of the test (newPG) on loopback. The nodes reach both through
// a Proxy each and connect with a multi-host URL that picks whichever takes
// writes (target_session_attrs=read-write), as clients of a replicated
// PostgreSQL do.
//
// A failover kills every process of the primary at once (SIGKILL to its
// process group, as a crash of its machine would end them), promotes the
// standby (pg_ctl promote) and brings the old primary back as the standby
// of the new one: pg_rewind (wal_log_hints=on) or, should that fail, a
// fresh pg_basebackup. Only then is the next failover injected.
//
// With sync (synchronous_standby_names='*', synchronous_commit=on) a
// commit is acknowledged only once the standby has it, so the promoted
// standby has every write any node was told about; the new primary takes
// writes only once its own standby is back. Without sync the standby lags:
// writes acknowledged by the old primary can be missing on the new one.
type pgPair struct {
	srv     [2]*pgServer
	primary int // index in srv of the current primary
	sync    bool
	logf    func(format string, args ...any)

	rewinds, baseBackups int
	steps                [][5]time.Duration // of each failover: see stepTimes
}

// pgReplicationConf goes into postgresql.conf of the primary (and so, by
// copying, of every standby made from it), not onto the command line: the
// single-user crash recovery that pg_rewind runs on a killed primary reads
// only the files, and must keep wal_log_hints on.
const pgReplicationConf = `
# leaderfeed integration: replicated pair
wal_log_hints = on           # pg_rewind
full_page_writes = on        # pg_rewind
wal_keep_size = '256MB'      # pg_rewind finds the WAL since the fork
wal_receiver_status_interval = 1s
wal_retrieve_retry_interval = 100ms  # not 5 s: promotion and reconnection wait for it
`

// startPGPair starts a primary and makes its standby with pg_basebackup -R.
func startPGPair(t *testing.T, sync bool) *pgPair {
	t.Helper()
	p := &pgPair{srv: [2]*pgServer{newPG(t), newPG(t)}, sync: sync, logf: t.Logf}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	a, b := p.srv[0], p.srv[1]
	if err := a.initdb(ctx); err != nil {
		t.Fatal(err)
	}
	b.pass = a.pass // a copy of a, with its users
	conf := pgReplicationConf
	if sync {
		conf += "synchronous_commit = on\nsynchronous_standby_names = '*'\n"
	} else {
		conf += "synchronous_commit = on\nsynchronous_standby_names = ''\n"
	}
	f, err := os.OpenFile(filepath.Join(a.dir, "data", "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteString(conf)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range p.srv {
		s.settings = "" // the file's settings hold
	}
	if err := a.start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.baseBackup(ctx, b, a); err != nil {
		t.Fatal(err)
	}
	if err := b.start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.waitStandby(ctx); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *pgPair) name() string { return "postgres" }

func (p *pgPair) targets() []string { return []string{p.srv[0].target(), p.srv[1].target()} }

func (p *pgPair) nodeURL(proxies []string) string { return p.srv[0].url(proxies...) }

// adminConn is how the harness reaches the primary: over its unix socket
// (no password hashing, which costs seconds on a loaded machine with the
// race detector on) and with a connect timeout that load does not hit.
func (p *pgPair) adminConn() string {
	return p.srv[p.primary].sourceConn() + " connect_timeout=30"
}

func (p *pgPair) prepare(ctx context.Context, election string) error {
	return pgPrepare(ctx, p.adminConn(), election)
}

func (p *pgPair) restart(context.Context) error { return errUnsupported }

func (p *pgPair) killFeeds(ctx context.Context, ids []string) (int, error) {
	return pgKillFeeds(ctx, p.adminConn(), ids)
}

// failover kills the primary, promotes the standby and makes the old
// primary its standby. writable is when a write first committed on the
// new primary: right after the promotion without sync, only once its new
// standby streams with sync.
func (p *pgPair) failover(ctx context.Context) (killed, writable int64, err error) {
	old, next := p.srv[p.primary], p.srv[1-p.primary]
	if killed, err = old.kill(); err != nil {
		return 0, 0, err
	}
	dead := Monotonic()
	if err := next.pgctl(ctx, "-w", "-t", "60", "promote"); err != nil {
		return 0, 0, err
	}
	p.primary = 1 - p.primary
	promoted := Monotonic()
	// The promotion's checkpoint runs in the background; until it is
	// done, the control file that pg_rewind reads still names the old
	// timeline and pg_rewind finds "no rewind required" (its manual says
	// to run CHECKPOINT on a just promoted source).
	if err := p.exec(ctx, "CHECKPOINT"); err != nil {
		return 0, 0, err
	}
	if !p.sync {
		if writable, err = p.write(ctx); err != nil {
			return 0, 0, err
		}
	}
	if err := p.rebuild(ctx, old, next); err != nil {
		return 0, 0, err
	}
	rebuilt := Monotonic()
	if err := p.waitStandby(ctx); err != nil {
		return 0, 0, err
	}
	streaming := Monotonic()
	if p.sync {
		if writable, err = p.write(ctx); err != nil {
			return 0, 0, err
		}
	}
	p.steps = append(p.steps, [5]time.Duration{
		time.Duration(dead - killed), time.Duration(promoted - dead), time.Duration(rebuilt - promoted),
		time.Duration(streaming - rebuilt), time.Duration(writable - killed)})
	return killed, writable, nil
}

// write commits a transaction on the primary (one that takes a
// transaction id, so its commit waits for a synchronous standby) and
// returns when it was acknowledged.
func (p *pgPair) write(ctx context.Context) (int64, error) {
	if err := p.exec(ctx, "SELECT pg_current_xact_id()"); err != nil {
		return 0, err
	}
	return Monotonic(), nil
}

// exec runs one statement on the primary.
func (p *pgPair) exec(ctx context.Context, sql string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.adminConn())
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, sql); err != nil {
		return fmt.Errorf("%s on the primary: %w", sql, err)
	}
	return nil
}

// stepTimes describes how long the steps of the failovers took.
func (p *pgPair) stepTimes() string {
	var b strings.Builder
	for i, name := range []string{"kill until every process was gone", "promotion", "old primary rewound and started",
		"until it streamed", "kill to a write committed"} {
		var ds []time.Duration
		for _, st := range p.steps {
			ds = append(ds, st[i])
		}
		fmt.Fprintf(&b, "\n  %s: median %s, p99 %s, worst %s", name, pct(ds, 0.5), pct(ds, 0.99), pct(ds, 1))
	}
	return b.String()
}

// serverLogs returns the ends of both servers' logs.
func (p *pgPair) serverLogs() string {
	var b strings.Builder
	for _, s := range p.srv {
		log, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
		if len(log) > 6000 {
			log = log[len(log)-6000:]
		}
		fmt.Fprintf(&b, "\n--- %s (port %d) server.log ends:\n%s", s.dir, s.port, log)
	}
	return b.String()
}

// kill sends SIGKILL to every process of the server (its postmaster leads
// a process group of its own: pg_ctl starts it with setsid) and waits
// until none of them runs. It returns the Monotonic time taken just before
// the signal.
func (s *pgServer) kill() (int64, error) {
	b, err := os.ReadFile(filepath.Join(s.dir, "data", "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	first, _, _ := bytes.Cut(b, []byte("\n"))
	pid, err := strconv.Atoi(strings.TrimSpace(string(first)))
	if err != nil || pid <= 1 {
		return 0, fmt.Errorf("postmaster.pid of %s: %q", s.dir, first)
	}
	if pgid, err := syscall.Getpgid(pid); err != nil || pgid != pid {
		return 0, fmt.Errorf("postmaster %d does not lead its process group (%d, %v)", pid, pgid, err)
	}
	at := Monotonic()
	if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil {
		return 0, fmt.Errorf("kill postmaster group %d: %w", pid, err)
	}
	s.killed = true
	if err := waitGroupDead(pid, 10*time.Second); err != nil {
		return at, err
	}
	// Nothing may reap the dead postmaster (its parent, pg_ctl, is gone,
	// and in a container the process that inherits it may not reap), and
	// PostgreSQL takes a zombie for a live postmaster: the lock file it
	// left would stop pg_rewind's crash recovery. No process of the
	// server runs, so the files can go, as an operator would remove them
	// (also the lock of the unix socket, which names the same process).
	for _, f := range []string{filepath.Join(s.dir, "data", "postmaster.pid"), filepath.Join(s.dir, fmt.Sprintf(".s.PGSQL.%d.lock", s.port))} {
		if err := os.Remove(f); err != nil && !os.IsNotExist(err) {
			return at, err
		}
	}
	return at, nil
}

// waitGroupDead waits until no process of process group pgid runs (a
// zombie does not: nothing may reap the postmaster's children, whose
// parent it was).
func waitGroupDead(pgid int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if err := syscall.Kill(-pgid, 0); errors.Is(err, syscall.ESRCH) {
			return nil // not even a zombie left
		}
		alive := 0
		stats, _ := filepath.Glob("/proc/[0-9]*/stat")
		for _, st := range stats {
			b, err := os.ReadFile(st)
			if err != nil {
				continue // ended meanwhile
			}
			i := bytes.LastIndexByte(b, ')')
			if i < 0 {
				continue
			}
			// After the command: state ppid pgrp ...
			f := strings.Fields(string(b[i+1:]))
			if len(f) < 3 || f[0] == "Z" || f[0] == "X" {
				continue
			}
			if g, _ := strconv.Atoi(f[2]); g == pgid {
				alive++
			}
		}
		if alive == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d processes of group %d still run %v after SIGKILL", alive, pgid, timeout)
		}
		time.Sleep(time.Millisecond)
	}
}

// sourceConn is a libpq connection string of s over its unix socket.
func (s *pgServer) sourceConn() string {
	return fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres", s.dir, s.port)
}

// rebuild makes old, killed, a standby of primary and starts it.
func (p *pgPair) rebuild(ctx context.Context, old, primary *pgServer) error {
	data := filepath.Join(old.dir, "data")
	out, err := old.command(ctx, "pg_rewind", "-D", data, "--source-server="+primary.sourceConn(), "-R").CombinedOutput()
	if err == nil {
		if _, serr := os.Stat(filepath.Join(data, "standby.signal")); serr != nil {
			err = fmt.Errorf("no standby.signal after pg_rewind -R: %w", serr)
		}
	}
	if err != nil {
		p.logf("pg_rewind failed, making a fresh base backup instead: %v\n%s", err, out)
		if err := os.RemoveAll(data); err != nil {
			return err
		}
		if err := p.baseBackup(ctx, old, primary); err != nil {
			return err
		}
	} else {
		p.rewinds++
	}
	if err := old.start(ctx); err != nil {
		return err
	}
	old.killed = false
	return nil
}

// baseBackup makes standby's data directory a copy of primary's, set up
// to follow it (-R: standby.signal and primary_conninfo).
func (p *pgPair) baseBackup(ctx context.Context, standby, primary *pgServer) error {
	c := primary.sourceConn()
	if out, err := standby.command(ctx, "pg_basebackup", "-d", c, "-D", filepath.Join(standby.dir, "data"),
		"-R", "-X", "stream", "-c", "fast").CombinedOutput(); err != nil {
		return fmt.Errorf("pg_basebackup: %v\n%s", err, out)
	}
	p.baseBackups++
	return nil
}

// waitStandby waits until the primary has a standby streaming from it,
// and with sync, one it counts as synchronous.
func (p *pgPair) waitStandby(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.adminConn())
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	for {
		var n int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication
			WHERE state = 'streaming' AND (sync_state = 'sync' OR NOT $1)`, p.sync).Scan(&n)
		if err != nil {
			return fmt.Errorf("waiting for the standby: %w", err)
		}
		if n > 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no standby streaming from the primary: %w", ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}
