package rethink_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	r "gopkg.in/rethinkdb/rethinkdb-go.v6"
)

// TestHeartbeatBatch runs one batch that mixes every kind of write on the
// server, and the same writes one by one with Heartbeat on a copy of the
// same records (other election names): each result of the batch must be
// what the single write gave, and a malformed record, a conflict or an
// invalid write must not keep the others from being written.
func TestHeartbeatBatch(t *testing.T) {
	db := newDatabase(t)
	st := openStore(t, nil, db, table)
	admin := connect(t)
	tb := r.DB(db).Table(table)
	ctx := testCtx(t)

	type setup struct {
		writes []backend.Write
		stored map[int]bool // writes that must be applied
	}
	// prepare writes the records of one copy, named prefix+kind, and
	// returns the writes to make on them.
	prepare := func(prefix string) setup {
		name := func(kind string) string { return prefix + kind }
		write := func(expected, next heartbeat.Record, kind string) backend.Write {
			next.Election = name(kind)
			return backend.Write{Expected: expected, Next: next}
		}
		claim := func(kind string, rs ...heartbeat.Record) []heartbeat.Record {
			var out []heartbeat.Record
			var last heartbeat.Record
			for _, nx := range rs {
				nx.Election = name(kind)
				got, err := st.Heartbeat(ctx, last, nx)
				if err != nil {
					t.Fatalf("setup of %s: %v", name(kind), err)
				}
				out, last = append(out, got), got
			}
			return out
		}
		renew := claim("renew", rec("a", 1, "addr-a"))
		stale := claim("stale", rec("a", 1, ""), rec("a", 1, ""), rec("b", 2, ""))
		claim("taken", rec("a", 3, ""))
		vacant := claim("vacant", rec("a", 1, ""), rec("", 1, ""))
		leased := claim("leased", heartbeat.Record{Leader: "a", Term: 4, Lease: 1500 * 1000})
		bad := map[string]any{"id": name("malformed"), "leaderfeed": 1, "leader": 42, "term": 1, "revision": 1, "timestamp": r.Now(), "value": nil}
		if _, err := tb.Insert(bad).RunWrite(admin, r.RunOpts{Context: ctx}); err != nil {
			t.Fatal(err)
		}
		foreign := map[string]any{"id": name("foreign"), "state": "the application's"}
		if _, err := tb.Insert(foreign).RunWrite(admin, r.RunOpts{Context: ctx}); err != nil {
			t.Fatal(err)
		}
		withLease := rec("a", 4, "v")
		withLease.Lease = 2500*1000 + 1
		return setup{
			writes: []backend.Write{
				0:  write(none, rec("c", 1, "addr-c"), "create"),                                             // first claim
				1:  write(renew[0], rec("a", 1, "addr-a2"), "renew"),                                         // renewal
				2:  write(stale[0], rec("c", 2, ""), "stale"),                                                // stale: conflict
				3:  write(heartbeat.Record{Revision: 1, Leader: "x", Term: 1}, rec("c", 2, ""), "malformed"), // malformed
				4:  write(none, rec("c", 1, ""), "taken"),                                                    // first claim on a record: conflict
				5:  write(heartbeat.Record{Revision: 3, Leader: "a", Term: 1}, rec("c", 1, ""), "missing"),   // no record: conflict
				6:  write(vacant[1], rec("c", 2, "addr-c"), "vacant"),                                        // claim of a vacancy
				7:  write(none, rec("", 1, "value-without-leader"), "invalid"),                               // invalid
				8:  write(none, rec("c", 1, ""), "foreign"),                                                  // the application's document: malformed
				9:  write(leased[0], withLease, "leased"),                                                    // lease rounded up
				10: write(stale[2], rec("", 2, ""), "stale2"),                                                // no record named stale2: conflict
			},
			stored: map[int]bool{0: true, 1: true, 6: true, 9: true},
		}
	}
	single, batch := prepare("s-"), prepare("b-")

	sub, cancel := context.WithCancel(ctx)
	defer cancel()
	feed, err := st.Subscribe(sub)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]backend.WriteResult, len(single.writes))
	for i, w := range single.writes {
		want[i].Record, want[i].Err = st.Heartbeat(ctx, w.Expected, w.Next)
	}
	got, err := st.HeartbeatBatch(ctx, batch.writes)
	if err != nil {
		t.Fatalf("HeartbeatBatch: %v", err)
	}
	if len(got) != len(batch.writes) {
		t.Fatalf("HeartbeatBatch: %d results for %d writes", len(got), len(batch.writes))
	}
	for i, w := range batch.writes {
		g, s := got[i], want[i]
		if err := sameResult(g, s); err != nil {
			t.Errorf("write %d (%s): batch %v / %v, single %v / %v: %v", i, w.Next.Election, g.Record, g.Err, s.Record, s.Err, err)
		}
		if batch.stored[i] != (g.Err == nil) {
			t.Errorf("write %d (%s): got %v, %v; applied should be %v", i, w.Next.Election, g.Record, g.Err, batch.stored[i])
		}
		if g.Err == nil {
			if g.Record.Election != w.Next.Election || g.Record.Timestamp.IsZero() {
				t.Errorf("write %d: stored %v at %v", i, g.Record, g.Record.Timestamp)
			}
			cur, err := st.Get(ctx, w.Next.Election)
			if err != nil || !cur.Equal(g.Record) {
				t.Errorf("write %d: Get gives %v, %v; want the stored %v", i, cur, err, g.Record)
			}
		}
	}
	if got[7].Err == nil || !errors.Is(got[7].Err, base.ErrInvalidConfig) {
		t.Errorf("invalid write: got %v, want ErrInvalidConfig", got[7].Err)
	}
	if got[9].Err == nil && got[9].Record.Lease != 2500*1000+1000 {
		t.Errorf("lease: stored %v, want it rounded up to the microsecond", got[9].Record.Lease)
	}

	// The store's one changefeed reports every applied write of the batch
	// (and of the single writes before it), with the election set.
	seen := map[string]heartbeat.Record{}
	for len(seen) < len(batch.stored) {
		n := next(t, feed)
		if n.Type == backend.RecordChanged && len(n.Record.Election) > 2 && n.Record.Election[:2] == "b-" {
			seen[n.Record.Election] = n.Record
		}
	}
	for i := range batch.stored {
		if r := seen[batch.writes[i].Next.Election]; !r.Equal(got[i].Record) {
			t.Errorf("feed: %s is %v, want %v", batch.writes[i].Next.Election, r, got[i].Record)
		}
	}

	// A batch of writes that are all refused, and an empty batch. (The
	// same writes again would succeed: a write that finds its own record
	// stored is taken for a retry of itself by the driver, as Heartbeat
	// does.)
	refusedWrites := append([]backend.Write(nil), batch.writes[:2]...)
	for i := range refusedWrites {
		refusedWrites[i].Next.Leader = "d"
	}
	again, err := st.HeartbeatBatch(ctx, refusedWrites)
	if err != nil || len(again) != 2 || !errors.Is(again[0].Err, backend.ErrConflict) || !errors.Is(again[1].Err, backend.ErrConflict) {
		t.Fatalf("the same writes again: got %v, %v; want two conflicts", again, err)
	}
	if res, err := st.HeartbeatBatch(ctx, nil); err != nil || len(res) != 0 {
		t.Fatalf("empty batch: got %v, %v", res, err)
	}
}

// sameResult reports how the result of a batched write differs from that
// of the same write made alone on a copy of the record: the same error
// class, and the same record or conflict record but for the election name
// and the timestamp.
func sameResult(b, s backend.WriteResult) error {
	classes := []error{backend.ErrConflict, backend.ErrMalformedRecord, base.ErrInvalidConfig, heartbeat.ErrInvalidRecord}
	for _, c := range classes {
		if errors.Is(b.Err, c) != errors.Is(s.Err, c) {
			return fmt.Errorf("errors.Is(%v) differs", c)
		}
	}
	if (b.Err == nil) != (s.Err == nil) {
		return errors.New("one failed, the other did not")
	}
	same := func(x, y heartbeat.Record) bool {
		return x.Leader == y.Leader && x.Term == y.Term && x.Revision == y.Revision && bytes.Equal(x.Value, y.Value) && x.Lease == y.Lease &&
			x.Timestamp.IsZero() == y.Timestamp.IsZero()
	}
	var bc, sc *backend.ConflictError
	if errors.As(b.Err, &bc) && errors.As(s.Err, &sc) && !same(bc.Current, sc.Current) {
		return fmt.Errorf("conflict records differ: %v and %v", bc.Current, sc.Current)
	}
	if b.Err == nil && !same(b.Record, s.Record) {
		return errors.New("stored records differ")
	}
	return nil
}

// TestElectionsBatched runs many elections on one Store through
// base.Elections, which batches their renewals: every claim and renewal
// succeeds and each election's record is its own.
func TestElectionsBatched(t *testing.T) {
	db := newDatabase(t)
	st := openStore(t, nil, db, table)
	es, err := base.NewElections(st, base.ElectionsOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer es.Close()
	ctx := testCtx(t)
	const n = 20
	var wg sync.WaitGroup
	for i := range n {
		b, err := es.Election(fmt.Sprintf("e%02d", i))
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if err := b.Create(ctx); err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			last, err := b.Heartbeat(ctx, none, rec(fmt.Sprintf("n%d", i), 1, ""))
			if err != nil {
				t.Errorf("%s: claim: %v", b.Name(), err)
				return
			}
			for range 5 {
				if last, err = b.Heartbeat(ctx, last, rec(fmt.Sprintf("n%d", i), 1, "")); err != nil {
					t.Errorf("%s: renewal: %v", b.Name(), err)
					return
				}
			}
			got, err := b.Get(ctx)
			if server.reqlite {
				// reqlite shares one query's r.now() object among every
				// document the query writes, and a later update merges
				// into it in place: a write of one election moves the
				// stored timestamp of the others of its batch. A real
				// RethinkDB stores values.
				got.Timestamp = last.Timestamp
			}
			if err != nil || !got.Equal(last) || got.Election != b.Name() || got.Revision != 6 {
				t.Errorf("%s: Get gives %v at %v, %v; want %v at %v", b.Name(), got, got.Timestamp, err, last, last.Timestamp)
			}
		})
	}
	wg.Wait()
}

// A batch names each election once: the first write or read of an
// election goes, every later one fails alone with ErrInvalidConfig.
func TestBatchDuplicateElection(t *testing.T) {
	st := openStore(t, nil, newDatabase(t), table)
	ctx := testCtx(t)
	writes := []backend.Write{
		{Next: heartbeat.Record{Election: "e", Leader: "a", Term: 1}},
		{Next: heartbeat.Record{Election: "e", Leader: "b", Term: 1}},
	}
	res, err := st.HeartbeatBatch(ctx, writes)
	if err != nil || len(res) != 2 {
		t.Fatalf("HeartbeatBatch: %v, %v", res, err)
	}
	if res[0].Err != nil || res[0].Record.Leader != "a" {
		t.Errorf("the first write of e: %+v, %v; want it applied", res[0].Record, res[0].Err)
	}
	if err := res[1].Err; !errors.Is(err, base.ErrInvalidConfig) || !errors.Is(err, heartbeat.ErrInvalidRecord) || errors.Is(err, backend.ErrConflict) {
		t.Errorf("the second write of e: %v, want ErrInvalidConfig", err)
	}
	reads, err := st.(backend.BatchReader).GetBatch(ctx, []string{"e", "e"})
	if err != nil || len(reads) != 2 || reads[0].Err != nil || !reads[0].Record.Equal(res[0].Record) || !errors.Is(reads[1].Err, base.ErrInvalidConfig) {
		t.Errorf("GetBatch(e, e) = %+v, %v; want the record, then ErrInvalidConfig", reads, err)
	}
}
