package rethink_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/internal/testenv"
	"github.com/leaderfeed/leaderfeed/rethink"
	"go.uber.org/goleak"
	r "gopkg.in/rethinkdb/rethinkdb-go.v6"
)

// server is the RethinkDB the tests use, found once in TestMain:
// LEADERFEED_RETHINK_ADDR, with LEADERFEED_RETHINK_REQLITE=1 when it is
// reqlite, as .ci/rethink.sh sets (the containertest module sets the address
// of a rethinkdb:2.4 container); else none, and tests call
// testenv.Unavailable.
var server struct {
	addr    string
	reqlite bool
	reason  string // why there is none
}

// TestMain finds the server, runs the tests and fails the run on leaked
// goroutines. The rethinkdb-go driver needs no exception: its goroutines
// (connection readers, the host pool's decay loop) end when the session is
// closed, which every test does.
func TestMain(m *testing.M) {
	server.addr = os.Getenv("LEADERFEED_RETHINK_ADDR")
	server.reqlite = os.Getenv("LEADERFEED_RETHINK_REQLITE") == "1"
	server.reason = "no RethinkDB: set LEADERFEED_RETHINK_ADDR (source .ci/rethink.sh starts reqlite)"
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// needServer skips (or fails, in CI) when there is no server.
func needServer(t testing.TB) {
	t.Helper()
	if server.addr == "" {
		testenv.Unavailable(t, server.reason)
	}
}

// connect opens a session of the test's own, closed at cleanup.
func connect(t testing.TB) *r.Session {
	t.Helper()
	return connectTo(t, server.addr)
}

func connectTo(t testing.TB, addr string) *r.Session {
	t.Helper()
	needServer(t)
	s, err := r.Connect(r.ConnectOpts{Address: addr, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("connect to %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

var nonName = regexp.MustCompile(`[^A-Za-z0-9_]+`)

// unique returns a name unique to the test, valid for RethinkDB.
func unique(t testing.TB, prefix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := nonName.ReplaceAllString(t.Name(), "_")
	if len(name) > 40 {
		name = name[len(name)-40:]
	}
	return strings.Trim(prefix+"_"+name, "_") + "_" + hex.EncodeToString(b[:])
}

// newDatabase creates a database unique to the test and drops it at
// cleanup (reqlite keeps data in memory only and has no "test" database).
func newDatabase(t testing.TB) string {
	t.Helper()
	s := connect(t)
	db := unique(t, "lf")
	if _, err := r.DBCreate(db).RunWrite(s); err != nil {
		t.Fatalf("create database %s: %v", db, err)
	}
	t.Cleanup(func() { _, _ = r.DBDrop(db).RunWrite(s) })
	return db
}

// writeMu serializes the writes of every store the tests open when the
// server is reqlite, which does not run update functions atomically across
// connections. Against a real RethinkDB the writes are not serialized.
var writeMu sync.Mutex

// serialized wraps a store so that its compare-and-set writes, single and
// batched, hold writeMu. Create is not serialized: racing creators must
// succeed anyway.
type serialized struct{ *rethink.Store }

func (s serialized) Heartbeat(ctx context.Context, expected, next heartbeat.Record) (heartbeat.Record, error) {
	writeMu.Lock()
	defer writeMu.Unlock()
	return s.Store.Heartbeat(ctx, expected, next)
}

func (s serialized) HeartbeatBatch(ctx context.Context, writes []backend.Write) ([]backend.WriteResult, error) {
	writeMu.Lock()
	defer writeMu.Unlock()
	return s.Store.HeartbeatBatch(ctx, writes)
}

// wrapWrites returns s, wrapped in serialized on reqlite.
func wrapWrites(s *rethink.Store) backend.BatchStore {
	if server.reqlite {
		return serialized{s}
	}
	return s
}

// newStore returns a Store on db.table over session s (a new session if
// nil), writes serialized on reqlite, not started, closed at cleanup.
func newStore(t testing.TB, s *r.Session, db, table string) backend.BatchStore {
	t.Helper()
	if s == nil {
		s = connect(t)
	}
	st, err := rethink.NewStore(s, rethink.Options{Database: db, Table: table})
	if err != nil {
		t.Fatalf("NewStore: %v", err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return wrapWrites(st)
}

// openStore returns a started and created store (newStore).
func openStore(t testing.TB, s *r.Session, db, table string) backend.BatchStore {
	t.Helper()
	st := newStore(t, s, db, table)
	ctx := testCtx(t)
	if err := st.Start(ctx); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if err := st.Create(ctx); err != nil {
		t.Fatalf("Create: %v", err)
	}
	return st
}

// open returns a started and created backend of election in db.table, on
// a store of its own (base.Open) over session s (a new session if nil),
// closed at cleanup; writes serialized on reqlite.
func open(t testing.TB, s *r.Session, db, table, election string) backend.Election {
	t.Helper()
	b, err := base.Open(newStore(t, s, db, table), election)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	ctx := testCtx(t)
	if err := b.Start(ctx); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if err := b.Create(ctx); err != nil {
		t.Fatalf("Create: %v", err)
	}
	return b
}

// testCtx is a context bounded well below the test timeout.
func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}
