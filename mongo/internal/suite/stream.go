package suite

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/mongo"
	"github.com/leaderfeed/leaderfeed/mongo/internal/driver"
)

// killStreams ends the change streams under st's open subscriptions, as a
// server or network failure would. The subscriptions send Failed.
func (s *Server) killStreams(st *mongo.Store) { s.faults(st).kill(errKilled) }

func subscribe(t *testing.T, b interface {
	Subscribe(context.Context) (<-chan backend.Notification, error)
}) <-chan backend.Notification {
	t.Helper()
	ch, err := b.Subscribe(testCtx(t))
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	return ch
}

// next returns the next notification, failing the test after 10 s.
func next(t *testing.T, ch <-chan backend.Notification) backend.Notification {
	t.Helper()
	select {
	case n, ok := <-ch:
		if !ok {
			t.Fatal("the subscription closed its channel")
		}
		return n
	case <-time.After(10 * time.Second):
		t.Fatal("no notification within 10 s")
	}
	panic("unreachable")
}

// wantRecord fails the test unless the next notification is want.
func wantRecord(t *testing.T, ch <-chan backend.Notification, want heartbeat.Record) {
	t.Helper()
	n := next(t, ch)
	if n.Type != backend.RecordChanged || !n.Record.Equal(want) {
		t.Fatalf("got %v %v (err %v), want record-changed %v", n.Type, n.Record, n.Err, want)
	}
}

func wantChange(t *testing.T, ch <-chan backend.Notification, op backend.Op, key string) backend.Change {
	t.Helper()
	n := next(t, ch)
	if n.Type != backend.OtherChanged || n.Change.Op != op || string(n.Change.Key) != key {
		t.Fatalf("got %v %+v (record %v, err %v), want %v of key %s", n.Type, n.Change, n.Record, n.Err, op, key)
	}
	return n.Change
}

func testSubscribeInOrder(t *testing.T, newServer NewServer) {
	s := newServer(t)
	el := electionName(t)
	b := s.started(t, el)
	ch := subscribe(t, b)
	ctx := testCtx(t)

	var want []heartbeat.Record
	last := none
	for i := range 10 {
		last = mustBeat(t, b, last, rec("a", 1, fmt.Sprint(i)))
		want = append(want, last)
	}
	if !s.Real {
		for _, r := range want {
			wantRecord(t, ch, r)
		}
	} else {
		// updateLookup may skip revisions on a real server; never reorder.
		var last uint64
		for last < 10 {
			n := next(t, ch)
			if n.Type != backend.RecordChanged || n.Record.Revision <= last {
				t.Fatalf("got %v %v after revision %d", n.Type, n.Record, last)
			}
			last = n.Record.Revision
		}
	}

	// Other documents: insert, replace, update, delete; keys as JSON.
	if err := s.Put(ctx, "k1", bson.M{"n": 1, "s": "x"}); err != nil {
		t.Fatal(err)
	}
	c := wantChange(t, ch, backend.Insert, `"k1"`)
	var doc map[string]any
	if err := json.Unmarshal(c.New, &doc); err != nil || doc["n"] != 1.0 || doc["s"] != "x" || doc["_id"] != "k1" {
		t.Fatalf("inserted document as JSON: %s (%v)", c.New, err)
	}
	if c.Table != s.Coll || c.Old != nil || c.Partial {
		t.Fatalf("change %+v", c)
	}
	if err := s.Put(ctx, "k1", bson.M{"n": 2}); err != nil {
		t.Fatal(err)
	}
	if c := wantChange(t, ch, backend.Update, `"k1"`); !strings.Contains(string(c.New), `"n":2`) {
		t.Fatalf("replaced document: %s", c.New)
	}
	if err := s.Update(ctx, "k1", bson.M{"$set": bson.M{"n": 3}}); err != nil {
		t.Fatal(err)
	}
	if c := wantChange(t, ch, backend.Update, `"k1"`); !strings.Contains(string(c.New), `"n":3`) {
		t.Fatalf("updated document: %s", c.New)
	}
	if err := s.Delete(ctx, "k1"); err != nil {
		t.Fatal(err)
	}
	if c := wantChange(t, ch, backend.Delete, `"k1"`); c.New != nil {
		t.Fatalf("deleted document: %s", c.New)
	}
	// Keys that are not strings, as relaxed extended JSON.
	oid := bson.NewObjectID()
	if err := s.Insert(ctx, bson.M{"_id": oid}); err != nil {
		t.Fatal(err)
	}
	wantChange(t, ch, backend.Insert, fmt.Sprintf(`{"$oid":"%s"}`, oid.Hex()))
	if err := s.Insert(ctx, bson.M{"_id": 42}); err != nil {
		t.Fatal(err)
	}
	wantChange(t, ch, backend.Insert, `42`)

	// Deleting the record.
	if err := s.Delete(ctx, el); err != nil {
		t.Fatal(err)
	}
	if n := next(t, ch); n.Type != backend.RecordDeleted {
		t.Fatalf("after deleting the record: %v", n.Type)
	}
	r := mustBeat(t, b, none, rec("b", 2, ""))
	wantRecord(t, ch, r)
}

// A stream that fails under a subscriber is reopened by the next Subscribe
// from its resume token: nothing written in between is lost.
func testResumeAfterStreamClosed(t *testing.T, newServer NewServer) {
	s := newServer(t)
	el := electionName(t)
	b := s.started(t, el)
	ctx := testCtx(t)
	ch := subscribe(t, b)
	r := mustBeat(t, b, none, rec("a", 1, ""))
	wantRecord(t, ch, r)

	s.killStreams(b.Store)
	n := next(t, ch)
	if n.Type != backend.Failed || n.Err == nil || !strings.HasPrefix(n.Err.Error(), "mongo: ") {
		t.Fatalf("after the stream closed: %v %v, want Failed", n.Type, n.Err)
	}
	if _, ok := <-ch; ok {
		t.Fatal("notification after Failed")
	}

	// Written while nobody watches.
	var want []heartbeat.Record
	for range 3 {
		r = mustBeat(t, b, r, rec("a", 1, ""))
		want = append(want, r)
	}
	if err := s.Put(ctx, "gap", bson.M{"x": 1}); err != nil {
		t.Fatal(err)
	}
	ch = subscribe(t, b)
	if !s.Real {
		for _, w := range want {
			wantRecord(t, ch, w)
		}
	} else {
		for n := next(t, ch); n.Record.Revision != want[2].Revision; n = next(t, ch) {
		}
	}
	wantChange(t, ch, backend.Insert, `"gap"`)
}

// Without a valid token the new stream starts now, and Subscribe delivers
// the record it re-reads first, so the record's state is never lost.
func testResumeTokenLost(t *testing.T, newServer NewServer) {
	s := newServer(t)
	el := electionName(t)
	var log lockedBuffer
	b := s.backend(t, el, mongo.Options{Logger: slog.New(slog.NewTextHandler(&log, nil))})
	ch := subscribe(t, b)
	r := mustBeat(t, b, none, rec("a", 1, ""))
	wantRecord(t, ch, r)
	s.killStreams(b.Store)
	for range ch {
	}
	r = mustBeat(t, b, r, rec("b", 2, "v"))

	// A token the server no longer has (as after an oplog rollover).
	tok, _ := bson.Marshal(bson.M{"_data": "8200000001000000012B0229296E04"})
	if !s.Real {
		tok, _ = bson.Marshal(bson.M{"ts": bson.Timestamp{T: 1, I: 1}})
	}
	f := s.faults(b.Store)
	f.mu.Lock()
	f.token = tok
	f.mu.Unlock()
	ch = subscribe(t, b)
	wantRecord(t, ch, r)
	r = mustBeat(t, b, r, rec("b", 2, "v"))
	wantRecord(t, ch, r)
	for _, want := range []string{"resume token no longer valid", "gap in the change stream"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("the log does not report %q:\n%s", want, log.String())
		}
	}
}

// lockedBuffer is a bytes.Buffer safe for concurrent use.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// A stream that never saw an event has no token (lungo gives none before
// the first event; a server older than 4.0.7 neither): reopening re-reads
// the record.
func testResumeWithoutToken(t *testing.T, newServer NewServer) {
	s := newServer(t)
	b := s.started(t, electionName(t))
	f := s.faults(b.Store)
	f.mu.Lock()
	f.hideTokens = true
	f.mu.Unlock()
	ch := subscribe(t, b)
	s.killStreams(b.Store)
	for range ch {
	}
	r := mustBeat(t, b, none, rec("a", 1, ""))
	ch = subscribe(t, b)
	wantRecord(t, ch, r)
	// And an election without a record is reported as deleted.
	s.killStreams(b.Store)
	for range ch {
	}
	if err := s.Delete(testCtx(t), b.Name()); err != nil {
		t.Fatal(err)
	}
	ch = subscribe(t, b)
	if n := next(t, ch); n.Type != backend.RecordDeleted {
		t.Fatalf("re-read of a missing record: %v", n.Type)
	}
}

// A change event over 16 MiB (BSONObjectTooLarge, code 10334, on a real
// server; injected here, since neither lungo nor a test can make one
// cheaply) ends the stream; resuming before it would meet it again, so
// the next stream starts at the present and the record is re-read.
func testEventTooLarge(t *testing.T, newServer NewServer) {
	s := newServer(t)
	el := electionName(t)
	var log lockedBuffer
	b := s.backend(t, el, mongo.Options{Logger: slog.New(slog.NewTextHandler(&log, nil))})
	ch := subscribe(t, b)
	r := mustBeat(t, b, none, rec("a", 1, ""))
	wantRecord(t, ch, r)
	s.faults(b.Store).kill(fmt.Errorf("%w: injected by the test", driver.ErrEventTooLarge))
	n := next(t, ch)
	if n.Type != backend.Failed || !errors.Is(n.Err, driver.ErrEventTooLarge) {
		t.Fatalf("after a too large event: %v %v, want Failed", n.Type, n.Err)
	}
	for range ch {
	}
	r = mustBeat(t, b, r, rec("b", 2, "v"))
	ch = subscribe(t, b)
	wantRecord(t, ch, r)
	r = mustBeat(t, b, r, rec("b", 2, "v"))
	wantRecord(t, ch, r)
	for _, want := range []string{"larger than 16 MiB", "gap in the change stream"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("the log does not report %q:\n%s", want, log.String())
		}
	}
}

func testHugeDocumentDelivered(t *testing.T, newServer NewServer) {
	s := newServer(t)
	b := s.started(t, electionName(t))
	ch := subscribe(t, b)
	blob := strings.Repeat("x", 1<<20)
	if err := s.Put(testCtx(t), "huge", bson.M{"blob": blob}); err != nil {
		t.Fatal(err)
	}
	c := wantChange(t, ch, backend.Insert, `"huge"`)
	var doc struct{ Blob string }
	if err := json.Unmarshal(c.New, &doc); err != nil || doc.Blob != blob || c.Partial {
		t.Fatalf("huge document: %d bytes of JSON, partial %v, err %v", len(c.New), c.Partial, err)
	}
}

func testDropCollection(t *testing.T, newServer NewServer) {
	s := newServer(t)
	el := electionName(t)
	b := s.started(t, el)
	ch := subscribe(t, b)
	r := mustBeat(t, b, none, rec("a", 1, ""))
	wantRecord(t, ch, r)
	if err := s.Drop(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if n := next(t, ch); n.Type != backend.RecordDeleted {
		t.Fatalf("after drop: %v", n.Type)
	}
	if n := next(t, ch); n.Type != backend.Failed || !errors.Is(n.Err, driver.ErrInvalidated) {
		t.Fatalf("after drop: %v %v, want Failed (invalidated)", n.Type, n.Err)
	}
	ch = subscribe(t, b)
	if n := next(t, ch); n.Type != backend.RecordDeleted {
		t.Fatalf("reopened after drop: %v", n.Type)
	}
	r = mustBeat(t, b, none, rec("a", 2, ""))
	wantRecord(t, ch, r)
}

func testTwoStoresSeeEachOther(t *testing.T, newServer NewServer) {
	s := newServer(t)
	el := electionName(t)
	a, c := s.started(t, el), s.started(t, el)
	ch := subscribe(t, c)
	r := mustBeat(t, a, none, rec("a", 1, "addr"))
	wantRecord(t, ch, r)
	if got, err := c.Get(testCtx(t)); err != nil || !got.Equal(r) {
		t.Fatalf("other store reads %v, %v", got, err)
	}
}

// One Store's one change stream carries the records of every election,
// each with its election, in commit order per election, and the documents
// of the caller's as OtherChanged; a deleted record is RecordDeleted with
// its election, known from the mark or from a Get, also when it was
// written before the stream opened.
func testOneStreamManyElections(t *testing.T, newServer NewServer) {
	s := newServer(t)
	ctx := testCtx(t)
	writer := s.started(t, "writer")
	old := electionName(t) + "-old"
	rOld := mustBeat(t, writer, none, heartbeat.Record{Election: old, Leader: "a", Term: 1})

	st := s.store(t, mongo.Options{})
	ch := subscribe(t, st)
	els := []string{electionName(t), electionName(t), electionName(t)}
	last := map[string]heartbeat.Record{}
	for round := range 3 {
		for _, el := range els {
			last[el] = mustBeat(t, writer, last[el], heartbeat.Record{Election: el, Leader: "a", Term: 1, Value: []byte(fmt.Sprint(round))})
		}
	}
	if err := s.Put(ctx, "user", bson.M{"n": 1}); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, old); err != nil {
		t.Fatal(err)
	}
	got := map[string][]uint64{}
	for {
		n := next(t, ch)
		if n.Type == backend.RecordChanged {
			got[n.Record.Election] = append(got[n.Record.Election], n.Record.Revision)
			continue
		}
		if n.Type != backend.OtherChanged || string(n.Change.Key) != `"user"` {
			t.Fatalf("got %v %+v, want the records, then the user document", n.Type, n)
		}
		break
	}
	for _, el := range els {
		if s.Real {
			if revs := got[el]; len(revs) == 0 || revs[len(revs)-1] != last[el].Revision || !slices.IsSorted(revs) {
				t.Errorf("election %s: revisions %v, want increasing to %d", el, revs, last[el].Revision)
			}
		} else if fmt.Sprint(got[el]) != "[1 2 3]" {
			t.Errorf("election %s: revisions %v, want [1 2 3]", el, got[el])
		}
	}
	if n := next(t, ch); n.Type != backend.RecordDeleted || n.Election != old {
		t.Fatalf("after deleting the record of %s (revision %d) written before the stream opened: %v %q", old, rOld.Revision, n.Type, n.Election)
	}
}
