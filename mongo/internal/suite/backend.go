package suite

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/mongo"
)

func rec(leader string, term uint64, value string) heartbeat.Record {
	r := heartbeat.Record{Leader: leader, Term: term}
	if value != "" {
		r.Value = []byte(value)
	}
	return r
}

// none is the expected record of a first write: no record exists.
var none heartbeat.Record

// mustBeat writes with a compare-and-set on the write expected that must
// succeed.
func mustBeat(t *testing.T, b *node, expected, next heartbeat.Record) heartbeat.Record {
	t.Helper()
	got, err := b.Heartbeat(testCtx(t), expected, next)
	if err != nil {
		t.Fatalf("Heartbeat(%v, %v): %v", expected, next, err)
	}
	return got
}

// mustConflict writes with a compare-and-set that must fail with a conflict
// and returns the record it carries.
func mustConflict(t *testing.T, b *node, expected, next heartbeat.Record) heartbeat.Record {
	t.Helper()
	_, err := b.Heartbeat(testCtx(t), expected, next)
	var ce *backend.ConflictError
	if !errors.As(err, &ce) || !errors.Is(err, backend.ErrConflict) {
		t.Fatalf("Heartbeat(%v, %v) = %v, want a *backend.ConflictError", expected, next, err)
	}
	return ce.Current
}

func testHeartbeatCompareAndSet(t *testing.T, newServer NewServer) {
	s := newServer(t)
	el := electionName(t)
	b := s.started(t, el)
	ctx := testCtx(t)

	if _, err := b.Get(ctx); !errors.Is(err, backend.ErrNotFound) {
		t.Fatalf("Get on an empty election = %v, want ErrNotFound", err)
	}
	if cur := mustConflict(t, b, heartbeat.Record{Revision: 3, Leader: "a", Term: 1}, rec("a", 1, "")); cur.Revision != 0 || cur.Election != el {
		t.Fatalf("conflict on a missing record carries %+v, want revision 0 of %q", cur, el)
	}

	before := time.Now().Add(-time.Minute)
	r1 := mustBeat(t, b, none, rec("a", 1, "addr-a"))
	if r1.Election != el || r1.Leader != "a" || r1.Term != 1 || r1.Revision != 1 || string(r1.Value) != "addr-a" {
		t.Fatalf("first claim stored %+v", r1)
	}
	if r1.Timestamp.Before(before) || r1.Timestamp.After(time.Now().Add(time.Minute)) {
		t.Fatalf("store timestamp %v is not about now", r1.Timestamp)
	}
	if got, err := b.Get(ctx); err != nil || !got.Equal(r1) {
		t.Fatalf("Get = %+v, %v; want %+v", got, err, r1)
	}

	// A second first claim loses on the duplicate _id.
	if cur := mustConflict(t, b, none, rec("b", 1, "")); !cur.Equal(r1) {
		t.Fatalf("conflict carries %+v, want %+v", cur, r1)
	}
	r2 := mustBeat(t, b, r1, rec("a", 1, "addr-a"))
	if r2.Revision != 2 || r2.Term != 1 {
		t.Fatalf("renewal stored %+v", r2)
	}
	if cur := mustConflict(t, b, r1, rec("b", 2, "")); !cur.Equal(r2) {
		t.Fatalf("stale claim's conflict carries %+v, want %+v", cur, r2)
	}
	// The stored revision with another leader or term is another write (a
	// store that lost a write can hand a revision out twice).
	for _, other := range []heartbeat.Record{{Revision: 2, Leader: "b", Term: 1}, {Revision: 2, Leader: "a", Term: 2}, {Revision: 2, Term: 1}} {
		if cur := mustConflict(t, b, other, rec("b", 2, "")); !cur.Equal(r2) {
			t.Fatalf("claim expecting %v: conflict carries %+v, want %+v", other, cur, r2)
		}
	}
	r3 := mustBeat(t, b, r2, rec("", 1, ""))
	if !r3.Vacant() || r3.Revision != 3 || r3.Term != 1 || len(r3.Value) != 0 {
		t.Fatalf("resign stored %+v", r3)
	}
	big := strings.Repeat("v", heartbeat.MaxValueLen)
	r4 := mustBeat(t, b, r3, rec("b", 2, big))
	if string(r4.Value) != big || r4.Revision != 4 {
		t.Fatalf("claim after vacancy stored %v", r4)
	}

	// Invalid records are refused before any write.
	for name, next := range map[string]heartbeat.Record{
		"bad election name":  {Election: "x\x01", Leader: "a"},
		"value too large":    rec("a", 5, big+"v"),
		"vacant with value":  rec("", 5, "v"),
		"control char in id": rec("a\n", 5, ""),
		"term beyond int64":  {Leader: "a", Term: 1 << 63},
		"lease too long":     {Leader: "a", Term: 5, Lease: heartbeat.MaxLease + 1},
		"negative lease":     {Leader: "a", Term: 5, Lease: -1},
		"vacant with lease":  {Term: 5, Lease: time.Second},
	} {
		if _, err := b.Heartbeat(ctx, r4, next); !errors.Is(err, base.ErrInvalidConfig) {
			t.Errorf("Heartbeat with %s = %v, want ErrInvalidConfig", name, err)
		}
	}
	if got, _ := b.Get(ctx); !got.Equal(r4) {
		t.Fatalf("refused writes changed the record to %v", got)
	}
}

func testConcurrentClaimsOneWinner(t *testing.T, newServer NewServer) {
	s := newServer(t)
	el := electionName(t)
	const n = 20
	backends := make([]*node, n)
	for i := range backends {
		backends[i] = s.started(t, el)
	}
	var expected heartbeat.Record
	for round := range 2 {
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			winners []heartbeat.Record
			losers  []heartbeat.Record
		)
		start := make(chan struct{})
		for i, b := range backends {
			wg.Go(func() {
				<-start
				got, err := b.Heartbeat(context.Background(), expected, rec(fmt.Sprintf("node-%d", i), uint64(round+1), ""))
				var ce *backend.ConflictError
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					winners = append(winners, got)
				case errors.As(err, &ce):
					losers = append(losers, ce.Current)
				default:
					t.Errorf("claim of node-%d: %v", i, err)
				}
			})
		}
		close(start)
		wg.Wait()
		if len(winners) != 1 {
			t.Fatalf("round %d: %d winners, want exactly 1: %v", round, len(winners), winners)
		}
		for _, l := range losers {
			if l.Revision < expected.Revision+1 {
				t.Errorf("round %d: loser saw revision %d", round, l.Revision)
			}
		}
		if winners[0].Revision != expected.Revision+1 {
			t.Fatalf("round %d: winner stored revision %d", round, winners[0].Revision)
		}
		expected = winners[0]
	}
}

func testCreate(t *testing.T, newServer NewServer) {
	s := newServer(t)
	el := electionName(t)
	ctx := testCtx(t)
	s.Coll = fmt.Sprintf("%s_create", s.Coll)
	strict := s.backend(t, el, mongo.Options{NoCreate: true})
	if err := strict.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// A refusal: retrying cannot make the collection; the error says how.
	if err := strict.Create(ctx); !errors.Is(err, base.ErrInvalidConfig) || !errors.Is(err, base.ErrRefused) ||
		!strings.Contains(err.Error(), "createCollection") {
		t.Fatalf("Create with NoCreate on a missing collection = %v, want ErrInvalidConfig and ErrRefused with the fix", err)
	}
	b := s.backend(t, el, mongo.Options{})
	for range 2 { // idempotent
		if err := b.Create(ctx); err != nil {
			t.Fatalf("Create: %v", err)
		}
	}
	if err := strict.Create(ctx); err != nil {
		t.Fatalf("Create with NoCreate on an existing collection: %v", err)
	}
}

// Start refuses a standalone mongod (no change streams) with
// backend.ErrUnsupported and says how to make a one-node replica set; a
// replica set member and a mongos pass.
func testStartStandalone(t *testing.T, newServer NewServer) {
	s := newServer(t)
	b := s.backend(t, electionName(t), mongo.Options{})
	ctx := testCtx(t)
	if err := b.Start(ctx); err != nil {
		t.Fatalf("Start on %s: %v", s.Kind, err)
	}
	if b.Name() == "" || b.Collection() != s.Coll {
		t.Fatalf("Election/Collection = %q/%q", b.Name(), b.Collection())
	}
	f := s.faults(b.Store)
	f.mu.Lock()
	f.hello, _ = bson.Marshal(bson.D{{Key: "isWritablePrimary", Value: true}, {Key: "maxWireVersion", Value: 21}})
	f.mu.Unlock()
	err := b.Start(ctx)
	if !errors.Is(err, backend.ErrUnsupported) || !strings.HasPrefix(err.Error(), "mongo: ") ||
		!strings.Contains(err.Error(), "--replSet") || !strings.Contains(err.Error(), "rs.initiate()") {
		t.Fatalf("Start on a standalone server = %v, want a mongo: error matching ErrUnsupported that says how to make a replica set", err)
	}
}

func testCanceledContext(t *testing.T, newServer NewServer) {
	s := newServer(t)
	b := s.started(t, electionName(t))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, errGet := b.Get(ctx)
	_, errBeat := b.Heartbeat(ctx, none, rec("a", 1, ""))
	_, errSub := b.Subscribe(ctx)
	for name, err := range map[string]error{
		"Start": b.Start(ctx), "Create": b.Create(ctx), "Get": errGet, "Heartbeat": errBeat, "Subscribe": errSub,
	} {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("%s with a cancelled context = %v, want context.Canceled", name, err)
		}
	}

	// A subscription ends when its context does, without a Failed.
	sctx, scancel := context.WithCancel(context.Background())
	ch, err := b.Subscribe(sctx)
	if err != nil {
		t.Fatal(err)
	}
	scancel()
	for n := range ch {
		if n.Type == backend.Failed {
			t.Fatalf("Failed after cancel: %v", n.Err)
		}
	}
}

func testCloseIdempotent(t *testing.T, newServer NewServer) {
	s := newServer(t)
	b := s.started(t, electionName(t))
	ctx := testCtx(t)
	ch, err := b.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := b.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
	}
	for range ch { // the subscription ends
	}
	_, errGet := b.Get(ctx)
	_, errBeat := b.Heartbeat(ctx, none, rec("a", 1, ""))
	_, errSub := b.Subscribe(ctx)
	for name, err := range map[string]error{
		"Start": b.Start(ctx), "Create": b.Create(ctx), "Get": errGet, "Heartbeat": errBeat, "Subscribe": errSub,
	} {
		if !errors.Is(err, base.ErrClosed) || !strings.HasPrefix(err.Error(), "mongo: ") {
			t.Errorf("%s after Close = %v, want a mongo: error matching ErrClosed", name, err)
		}
	}
}

// A document under an election's _id that breaks the record rules is
// malformed: Get reports it, the feed reports it as Ignored with the
// election and goes on, and no compare-and-set overwrites it. A document
// with the mark is an election's whatever its _id; one without it is, once
// the store knows the _id as an election's (a Get, a Heartbeat, or the mark
// seen before), and otherwise the caller's own (OtherChanged).
func testMalformedRecord(t *testing.T, newServer NewServer) {
	s := newServer(t)
	el := electionName(t)
	b := s.started(t, el)
	ctx := testCtx(t)
	ch := subscribe(t, b)

	docs := []bson.M{
		{"leaderfeed": 1, "leader": "a", "term": 1}, // marked, fields missing
		{"leaderfeed": 1, "leader": 5},
		{"leaderfeed": 1, "leader": "a", "term": 1, "revision": -1, "ts": time.Now(), "value": []byte{}},
		{"leaderfeed": 1, "leader": "a\x01", "term": 1, "revision": 1, "ts": time.Now(), "value": []byte{}},
		{"leaderfeed": 2, "leader": "a", "term": 1, "revision": 1, "ts": time.Now(), "value": []byte{}},
		// Without the mark: the store knows el from the Get and
		// Heartbeat of the first rounds.
		{"leader": 5},  // a foreign document
		{"foo": "bar"}, // no leaderfeed fields
	}
	for i, doc := range docs {
		if err := s.Put(ctx, el, doc); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Get(ctx); !errors.Is(err, backend.ErrMalformedRecord) {
			t.Fatalf("doc %d %v: Get = %v, want ErrMalformedRecord", i, doc, err)
		}
		n := next(t, ch)
		if n.Type != backend.Ignored || !errors.Is(n.Err, backend.ErrMalformedRecord) || n.Election != el {
			t.Fatalf("doc %d: notification %v %v of %q, want Ignored with ErrMalformedRecord of %q", i, n.Type, n.Err, n.Election, el)
		}
		// No compare-and-set overwrites it.
		_, err := b.Heartbeat(ctx, none, rec("a", 1, ""))
		if errors.Is(err, backend.ErrConflict) || !errors.Is(err, backend.ErrMalformedRecord) {
			t.Fatalf("doc %d: claim over a malformed record = %v", i, err)
		}
	}
	// The feed goes on; a document without the mark under another _id is
	// the caller's.
	if err := s.Put(ctx, "other", bson.M{"x": 1}); err != nil {
		t.Fatal(err)
	}
	if n := next(t, ch); n.Type != backend.OtherChanged || string(n.Change.Key) != `"other"` {
		t.Fatalf("after malformed records: %+v", n)
	}
	// Deleting the foreign document frees the election.
	if err := s.Delete(ctx, el); err != nil {
		t.Fatal(err)
	}
	if n := next(t, ch); n.Type != backend.RecordDeleted || n.Election != el {
		t.Fatalf("after deleting: %+v", n)
	}
	r := mustBeat(t, b, none, rec("a", 1, ""))
	if n := next(t, ch); n.Type != backend.RecordChanged || !n.Record.Equal(r) {
		t.Fatalf("after claiming: %+v", n)
	}
}

// testLease: the lease is stored in whole microseconds, rounded up; a
// document written before the field existed (no lease_us) is a record with
// Lease 0 that a compare-and-set takes over like any other; a vacant
// document that still holds a lease (an older writer's $set of leader "")
// is vacant with Lease 0, not malformed; a lease of the wrong type or out
// of range is malformed.
func testLease(t *testing.T, newServer NewServer) {
	s := newServer(t)
	el := electionName(t)
	b := s.started(t, el)
	ctx := testCtx(t)

	next := rec("a", 1, "")
	next.Lease = 1500*time.Millisecond + 250*time.Microsecond + 1
	want := 1500*time.Millisecond + 251*time.Microsecond
	r1 := mustBeat(t, b, none, next)
	if got, err := b.Get(ctx); r1.Lease != want || err != nil || !got.Equal(r1) {
		t.Fatalf("lease %v stored as %v, Get %v (%v, %v); want %v", next.Lease, r1.Lease, got, got.Lease, err, want)
	}

	legacy := bson.M{"leaderfeed": 1, "leader": "old", "term": int64(4), "revision": int64(7), "ts": time.Now(), "value": []byte{}}
	if err := s.Put(ctx, el, legacy); err != nil {
		t.Fatal(err)
	}
	old, err := b.Get(ctx)
	if err != nil || old.Leader != "old" || old.Revision != 7 || old.Lease != 0 {
		t.Fatalf("document without a lease: got %v (lease %v), %v; want leader old at revision 7, lease 0", old, old.Lease, err)
	}
	next.Lease = time.Second
	if r := mustBeat(t, b, old, next); r.Revision != 8 || r.Lease != time.Second {
		t.Fatalf("claim over a document without a lease stored %v (lease %v)", r, r.Lease)
	}

	stale := bson.M{"leaderfeed": 1, "leader": "", "term": int64(4), "revision": int64(9), "ts": time.Now(), "value": []byte{}, "lease_us": int64(1000)}
	if err := s.Put(ctx, el, stale); err != nil {
		t.Fatal(err)
	}
	v, err := b.Get(ctx)
	if err != nil || !v.Vacant() || v.Revision != 9 || v.Lease != 0 {
		t.Fatalf("vacant document with a stale lease: got %v (lease %v), %v; want vacant at revision 9, lease 0", v, v.Lease, err)
	}
	if r := mustBeat(t, b, v, next); r.Revision != 10 {
		t.Fatalf("claim over it stored %v", r)
	}

	for name, lease := range map[string]any{
		"string": "1000", "negative": int64(-1), "fraction": 1.5, "too long": heartbeat.MaxLease.Microseconds() + 1,
	} {
		doc := bson.M{"leaderfeed": 1, "leader": "a", "term": int64(4), "revision": int64(11), "ts": time.Now(), "value": []byte{}, "lease_us": lease}
		if err := s.Put(ctx, el, doc); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Get(ctx); !errors.Is(err, backend.ErrMalformedRecord) {
			t.Errorf("lease %s: Get = %v, want ErrMalformedRecord", name, err)
		}
	}
}
