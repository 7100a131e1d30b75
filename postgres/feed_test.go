package postgres

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/base/basetest"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/internal/testenv"
)

// feedTiming is more lenient than basetest.FastTiming: these tests run
// beside others under -race on small machines, where a renewal can wait
// tens of milliseconds for a CPU.
var feedTiming = heartbeat.Timing{
	HeartbeatInterval:  50 * time.Millisecond,
	ElectionTimeoutMin: 600 * time.Millisecond,
	ElectionTimeoutMax: 900 * time.Millisecond,
	LeaseDuration:      300 * time.Millisecond,
}

// killListeners terminates the server processes of the LISTEN connections
// of stores.
func killListeners(t *testing.T, pool *pgxpool.Pool, stores ...*Store) {
	t.Helper()
	for _, s := range stores {
		pids := s.listenerPIDs()
		if len(pids) == 0 {
			t.Fatal("store has no LISTEN connection")
		}
		for _, pid := range pids {
			mustExec(t, pool, "SELECT pg_terminate_backend($1)", int(pid))
		}
	}
}

func isType(tp base.EventType) func(base.Event) bool {
	return func(e base.Event) bool { return e.Type == tp }
}

// waitFeedsOpen waits until every node's feed is open after event from[i].
func waitFeedsOpen(t *testing.T, c *basetest.Cluster, from []int) {
	t.Helper()
	for i, n := range c.Nodes {
		n.WaitEvent(t, from[i], wait, "subscribe-started", isType(base.EventSubscribeStarted))
	}
}

func marks(c *basetest.Cluster) []int {
	m := make([]int, len(c.Nodes))
	for i, n := range c.Nodes {
		m[i] = len(n.Events())
	}
	return m
}

// TestFeedsRecoverFromListenerKill kills the LISTEN connection under running
// feeds, again and again: every feed reports the error and reopens, the
// leader's renewals never fail with the killed connection's error (they do
// not use that connection), nobody else leads meanwhile (the Checker of the
// cluster), and the election goes on afterwards. A lease may still run out
// on a loaded machine, a renewal timing out: that is allowed, an error of
// the killed connection is not.
func TestFeedsRecoverFromListenerKill(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		all  bool // kill every node's listener, not one follower's
	}{{"every listener", true}, {"one listener", false}} {
		t.Run(tc.name, func(t *testing.T) {
			pool := newPool(t)
			table := uniqueName(t)
			var stores []*Store
			c := basetest.NewCluster(t, func(e string) (backend.Election, error) {
				s, err := NewStore(pool, Options{Table: table})
				if err != nil {
					return nil, err
				}
				stores = append(stores, s)
				return base.Open(s, e)
			}, basetest.ScaledTiming(feedTiming), 3, 1)
			storeOf := map[string]*Store{}
			for i, n := range c.Nodes {
				storeOf[n.ID] = stores[i]
			}
			waitFeedsOpen(t, c, make([]int, len(c.Nodes)))
			l := c.WaitLeader(t, basetest.Scaled(2*time.Second))

			for range 3 {
				m := marks(c)
				victims := c.Nodes
				if !tc.all {
					victims = []*basetest.Node{c.Nodes[len(c.Nodes)-1]}
				}
				for _, v := range victims {
					killListeners(t, pool, storeOf[v.ID])
				}
				for i, n := range c.Nodes {
					if !slices.Contains(victims, n) {
						continue
					}
					_, at := n.WaitEvent(t, m[i], wait, "subscribe-error", isType(base.EventSubscribeError))
					n.WaitEvent(t, at, wait, "subscribe-started after the error", isType(base.EventSubscribeStarted))
				}
				l = c.WaitLeader(t, basetest.Scaled(2*time.Second))
			}
			c.RequireLeaseEndsOnly(t)
			for _, n := range c.Nodes {
				for _, e := range n.Events() {
					if e.Type == base.EventUnelected && e.Err != nil && !errors.Is(e.Err, context.DeadlineExceeded) {
						t.Errorf("%s: %v: a renewal failed by the killed LISTEN connection, not by a slow store", n.ID, e)
					}
				}
			}
			if err := l.Feed.Resign(ctxT(t)); err != nil {
				t.Fatalf("Resign: %v", err)
			}
			c.WaitLeader(t, basetest.Scaled(2*time.Second), l)
		})
	}
}

// privateServer is a PostgreSQL cluster of the test's own, reached by its
// unix socket only, so that the test can restart it without disturbing the
// server that other tests (of this and other packages) use. It needs the
// server binaries (Debian's layout or initdb and pg_ctl on PATH).
type privateServer struct {
	pgctl, dir string
	asRoot     bool
}

func (s *privateServer) run(t *testing.T, name string, args ...string) {
	t.Helper()
	if s.asRoot {
		args = append([]string{"-u", "postgres", "--", name}, args...)
		name = "runuser"
	}
	cmd := exec.Command(name, args...)
	// The server's output goes to its log file: a pipe here would be held
	// open by the server.
	cmd.WaitDelay = time.Second
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v: %v (log in %s)", cmd, err, s.dir)
	}
}

func newPrivateServer(t *testing.T) (*privateServer, string) {
	t.Helper()
	var bin string
	if dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_ctl"); len(dirs) > 0 {
		slices.Sort(dirs)
		bin = filepath.Dir(dirs[len(dirs)-1])
	} else if p, err := exec.LookPath("pg_ctl"); err == nil {
		bin = filepath.Dir(p)
	} else {
		testenv.Unavailable(t, "no PostgreSQL server binaries (pg_ctl) to run a private server")
	}
	s := &privateServer{pgctl: filepath.Join(bin, "pg_ctl"), asRoot: os.Geteuid() == 0}
	dir, err := os.MkdirTemp("", "leaderfeed-pgrestart-")
	if err != nil {
		t.Fatal(err)
	}
	s.dir = dir
	if s.asRoot {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root, but no user postgres to run the server: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	data := filepath.Join(dir, "data")
	s.run(t, filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "--auth=trust", "--no-sync",
		"-E", "UTF8", "--no-locale")
	t.Cleanup(func() {
		s.run(t, s.pgctl, "-D", data, "-m", "immediate", "-w", "stop")
		_ = os.RemoveAll(dir)
	})
	s.run(t, s.pgctl, "-D", data, "-l", filepath.Join(dir, "server.log"), "-w", "-t", "60",
		"-o", "-c listen_addresses='' -k "+dir+" -c fsync=off", "start")
	return s, fmt.Sprintf("host=%s port=5432 user=postgres dbname=postgres sslmode=disable", dir)
}

func (s *privateServer) restart(t *testing.T) {
	s.run(t, s.pgctl, "-D", filepath.Join(s.dir, "data"), "-l", filepath.Join(s.dir, "server.log"),
		"-m", "fast", "-w", "-t", "60", "restart")
}

// TestFeedsSurviveServerRestart restarts the server under a running
// election: nobody leads twice at once (the Checker), and a node leads and
// renews again once the server is back. It runs its own server.
func TestFeedsSurviveServerRestart(t *testing.T) {
	t.Parallel()
	srv, url := newPrivateServer(t)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	table := uniqueName(t)
	c := basetest.NewCluster(t, func(e string) (backend.Election, error) {
		return New(pool, e, Options{Table: table})
	}, basetest.ScaledTiming(feedTiming), 3, 0)
	waitFeedsOpen(t, c, make([]int, len(c.Nodes)))
	l := c.WaitLeader(t, basetest.Scaled(2*time.Second))
	m := marks(c)

	start := time.Now()
	srv.restart(t)
	t.Logf("server restarted in %v", time.Since(start))
	for i, n := range c.Nodes {
		n.WaitEvent(t, m[i], wait, "subscribe-error", isType(base.EventSubscribeError))
	}
	// A node leads (the old leader if the restart was shorter than its
	// lease) and its renewals reach the restarted server.
	l2 := c.WaitLeader(t, 10*time.Second)
	probe, err := New(pool, c.Election, Options{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	var first heartbeat.Record
	deadline := time.Now().Add(wait)
	for {
		r, err := probe.Get(ctxT(t))
		switch {
		case err != nil:
		case first.Revision == 0:
			first = r
		case r.Revision > first.Revision && !r.Vacant():
			t.Logf("%s leads %v after the restart began (old leader %s); term %d, revision %d",
				r.Leader, time.Since(start), l.ID, r.Term, r.Revision)
			waitFeedsOpen(t, c, m)
			if l2 != l && r.Term <= first.Term && first.Leader == l.ID {
				t.Fatalf("new leader %s has term %d, not above the old leader's %d", r.Leader, r.Term, first.Term)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no renewal reached the server within %v after the restart (first read %+v)", wait, first)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestDecodeNotificationsOfOlderTriggers decodes records as the trigger
// functions of older versions announce them, without the keys of the
// columns added since ("h" handover, "i" incarnation): they read as none,
// as the rows of a table that gained the columns do. A current record
// carries its incarnation exactly, and one out of range is ignored as
// malformed.
func TestDecodeNotificationsOfOlderTriggers(t *testing.T) {
	o, err := Options{}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	f := &feed{s: &Store{opts: o}, fctx: context.Background()}
	head := `{"k":"b","s":"` + o.Schema + `","t":"` + o.Table + `","rs":[{"op":"U","e":"e","l":"a","n":3,"r":9,"ts":1700000000000000,"v":"","ls":1000,"sc":""`
	for _, tc := range []struct {
		name, rest            string
		handover, incarnation uint64
		malformed             bool
	}{
		{name: "before handover", rest: ``},
		{name: "before incarnation", rest: `,"h":7`, handover: 7},
		{name: "current", rest: `,"h":0,"i":9007199254740991`, incarnation: heartbeat.MaxToken},
		{name: "current, incarnation 0", rest: `,"h":0,"i":0`},
		{name: "incarnation over MaxToken", rest: `,"h":0,"i":9007199254740992`, malformed: true},
		{name: "negative incarnation", rest: `,"h":0,"i":-1`, malformed: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := f.decode(&pgconn.Notification{Payload: head + tc.rest + `}]}`})
			if len(ns) != 1 {
				t.Fatalf("%d notifications, want 1", len(ns))
			}
			n := ns[0]
			if tc.malformed {
				if n.Type != backend.Ignored || !errors.Is(n.Err, backend.ErrMalformedRecord) {
					t.Fatalf("got %v %+v (%v), want Ignored with ErrMalformedRecord", n.Type, n.Record, n.Err)
				}
				return
			}
			want := heartbeat.Record{Election: "e", Leader: "a", Term: 3, Revision: 9, Timestamp: time.UnixMicro(1700000000000000).UTC(),
				Lease: time.Millisecond, Handover: tc.handover, Incarnation: tc.incarnation}
			if n.Type != backend.RecordChanged || !n.Record.Equal(want) {
				t.Fatalf("got %v %+v (%v), want %+v", n.Type, n.Record, n.Err, want)
			}
		})
	}
}

// TestDecodeDropsOnlyRecordsNotOurs: a chunk decodes in one pass; one whose
// records are not all ours (a field of the wrong type, no election) loses
// those records alone.
func TestDecodeDropsOnlyRecordsNotOurs(t *testing.T) {
	o, err := Options{}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	f := &feed{s: &Store{opts: o}, fctx: context.Background()}
	rec := func(e string) string {
		return `{"op":"U","e":"` + e + `","l":"a","n":3,"r":9,"ts":1700000000000000,"v":"","ls":1000,"sc":"","h":0,"i":5}`
	}
	head := `{"k":"b","s":"` + o.Schema + `","t":"` + o.Table + `","rs":[`
	for _, tc := range []struct {
		name string
		rs   []string
		want []string
	}{
		{name: "ours", rs: []string{rec("e1"), rec("e2")}, want: []string{"e1", "e2"}},
		{name: "leader of the wrong type", rs: []string{rec("e1"), `{"op":"U","e":"e2","l":5,"n":3,"r":9}`, rec("e3")}, want: []string{"e1", "e3"}},
		{name: "no election", rs: []string{`{"op":"U","l":"a","n":3,"r":9}`, rec("e2")}, want: []string{"e2"}},
		{name: "not an object", rs: []string{rec("e1"), `"x"`}, want: []string{"e1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := f.decode(&pgconn.Notification{Payload: head + strings.Join(tc.rs, ",") + `]}`})
			var got []string
			for _, n := range ns {
				if n.Type != backend.RecordChanged || n.Record.Leader != "a" || n.Record.Incarnation != 5 {
					t.Fatalf("got %v %+v (%v), want a record of leader a, incarnation 5", n.Type, n.Record, n.Err)
				}
				got = append(got, n.Record.Election)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("elections %q, want %q", got, tc.want)
			}
		})
	}
	if ns := f.decode(&pgconn.Notification{Payload: `{"k":"b","s":5,"t":"` + o.Table + `","rs":[` + rec("e1") + `]}`}); len(ns) != 0 {
		t.Fatalf("a chunk of another table gave %d notifications", len(ns))
	}
}
