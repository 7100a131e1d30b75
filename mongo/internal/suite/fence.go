package suite

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/mongo"
	"github.com/leaderfeed/leaderfeed/mongo/internal/driver"
)

// The fault-injecting wrapper forwards the transactions of the collection
// it wraps, as every wrapper forwards every capability.
var _ driver.Transactions = (*faulty)(nil)

func (f *faulty) InTransaction(ctx context.Context) bool {
	tc, ok := f.Collection.(driver.Transactions)
	return ok && tc.InTransaction(ctx)
}

func (f *faulty) UpdateInTransaction(ctx context.Context, filter, update bson.D) error {
	tc, ok := f.Collection.(driver.Transactions)
	if !ok {
		return errors.New("the wrapped collection has no transactions")
	}
	return tc.UpdateInTransaction(ctx, filter, update)
}

func (f *faulty) AbortTransaction(ctx context.Context) error {
	if tc, ok := f.Collection.(driver.Transactions); ok {
		return tc.AbortTransaction(ctx)
	}
	return nil
}

// wantFenced checks that err matches base.ErrFenced and says what it
// should.
func wantFenced(t *testing.T, what string, err error, words ...string) {
	t.Helper()
	if !errors.Is(err, base.ErrFenced) {
		t.Fatalf("%s: %v, want ErrFenced", what, err)
	}
	for _, w := range words {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("%s: %v, want it to say %q", what, err, w)
		}
	}
}

// A leader's transaction that called Fence commits before any later
// write of the record: its fenced write of the current term commits; once
// another node claimed, the old term is fenced and nothing of the
// transaction commits, even if its callback returns nil; a vacant or
// missing record fences every term; a claim sent while a fenced
// transaction is open commits after it; and the fence's writes reach no
// reader of the change stream.
func testFence(t *testing.T, newServer NewServer) {
	s := newServer(t)
	if s.Transaction == nil {
		t.Skip("this server runs no transactions")
	}
	el := electionName(t)
	b := s.started(t, el)
	ctx := testCtx(t)
	user := s.Open(s.Coll)
	committed := func(id string) bool {
		t.Helper()
		_, err := user.FindOne(ctx, id)
		if err != nil && !errors.Is(err, driver.ErrNoDocument) {
			t.Fatalf("read %q: %v", id, err)
		}
		return err == nil
	}

	// A reader that sees everything the stream delivers.
	watcher := s.backend(t, el, mongo.Options{})
	notes, err := watcher.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}

	r1 := mustBeat(t, b, none, rec("a", 1, ""))
	if err := s.Transaction(ctx, func(ctx context.Context) error {
		if err := b.Fence(ctx, el, 1); err != nil {
			return err
		}
		return s.Insert(ctx, bson.M{"_id": el + "-1"})
	}); err != nil {
		t.Fatalf("fenced transaction of the leader: %v", err)
	}
	if !committed(el + "-1") {
		t.Fatal("the leader's fenced write did not commit")
	}
	if err := b.Fence(ctx, el, 1); !errors.Is(err, base.ErrInvalidConfig) {
		t.Fatalf("Fence outside a transaction: %v, want ErrInvalidConfig", err)
	}

	r2 := mustBeat(t, b, r1, rec("b", 2, ""))
	var fenced error
	err = s.Transaction(ctx, func(ctx context.Context) error {
		if err := s.Insert(ctx, bson.M{"_id": el + "-2"}); err != nil {
			return err
		}
		fenced = b.Fence(ctx, el, 1)
		return nil // a careless caller: the transaction must not commit all the same
	})
	wantFenced(t, "Fence of the old term", fenced, el, "term 1 asked", `term 2 found (leader "b")`)
	if committed(el + "-2") {
		t.Fatalf("the write of a deposed leader's transaction committed (the transaction returned %v)", err)
	}

	v := mustBeat(t, b, r2, rec("", 2, ""))
	err = s.Transaction(ctx, func(ctx context.Context) error { return b.Fence(ctx, el, 2) })
	wantFenced(t, "Fence on a vacant record", err, "term 2 asked", "term 2 found with no leader")
	err = s.Transaction(ctx, func(ctx context.Context) error { return b.Fence(ctx, el+"-nobody", 2) })
	wantFenced(t, "Fence on a missing record", err, "term 2 asked", "no record found")

	// A claim sent while a fenced transaction is open commits after it.
	r3 := mustBeat(t, b, v, rec("c", 3, ""))
	type result struct {
		r    heartbeat.Record
		err  error
		done time.Time
	}
	claimed := make(chan result, 1)
	var ended time.Time
	err = s.Transaction(ctx, func(ctx context.Context) error {
		if err := b.Fence(ctx, el, 3); err != nil {
			return err
		}
		go func() {
			r, err := b.Heartbeat(testCtx(t), r3, rec("d", 4, ""))
			claimed <- result{r, err, time.Now()}
		}()
		select {
		case c := <-claimed:
			t.Errorf("the claim returned while the fenced transaction was open: %+v, %v", c.r, c.err)
			claimed <- c
		case <-time.After(300 * time.Millisecond):
		}
		if err := s.Insert(ctx, bson.M{"_id": el + "-3"}); err != nil {
			return err
		}
		ended = time.Now()
		return nil
	})
	if err != nil {
		t.Fatalf("fenced transaction: %v", err)
	}
	c := <-claimed
	if c.err != nil || c.r.Term != 4 || c.r.Revision != r3.Revision+1 {
		t.Fatalf("the claim after the fenced transaction: %+v, %v", c.r, c.err)
	}
	if c.done.Before(ended) || !committed(el+"-3") {
		t.Fatalf("the claim returned at %v, before the fenced transaction ended (%v), or its write is missing", c.done, ended)
	}

	// The stream delivered each write of the record once, in order, and
	// nothing for the fences.
	want := []uint64{r1.Revision, r2.Revision, v.Revision, r3.Revision, c.r.Revision}
	var got []uint64
	for len(got) == 0 || got[len(got)-1] != c.r.Revision {
		select {
		case n := <-notes:
			switch {
			case n.Type == backend.RecordChanged && n.Record.Election == el:
				got = append(got, n.Record.Revision)
			case n.Type == backend.OtherChanged && string(n.Change.Key) == `"`+el+`"`:
				t.Fatalf("the fence's write arrived as a change: %+v", n.Change)
			}
		case <-ctx.Done():
			t.Fatalf("the stream delivered revisions %v, want %v", got, want)
		}
	}
	// A real server's update lookup may skip revisions, never repeat one.
	if !s.Real && !slices.Equal(got, want) || s.Real && !slices.IsSorted(got) {
		t.Fatalf("the stream delivered revisions %v, want %v (and nothing for the fences)", got, want)
	}
	select {
	case n := <-notes:
		if n.Type == backend.RecordChanged && n.Record.Election == el || n.Type == backend.OtherChanged && string(n.Change.Key) == `"`+el+`"` {
			t.Fatalf("a notification after the last write: %+v", n)
		}
	case <-time.After(200 * time.Millisecond):
	}

	// A stream that has delivered no record yet (a new store's) knows no
	// revision to compare with: it drops the fence's event by its shape
	// (an update of the fence counter alone).
	fresh := s.backend(t, el, mongo.Options{})
	freshNotes, err := fresh.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Transaction(ctx, func(ctx context.Context) error { return b.Fence(ctx, el, 4) }); err != nil {
		t.Fatalf("fenced transaction: %v", err)
	}
	if err := s.Insert(ctx, bson.M{"_id": el + "-after"}); err != nil {
		t.Fatal(err)
	}
	for {
		select {
		case n := <-freshNotes:
			if n.Type == backend.OtherChanged && string(n.Change.Key) == `"`+el+`-after"` {
				return // the write after the fence arrived, and nothing before it
			}
			t.Fatalf("a new stream delivered %+v for a fence", n)
		case <-ctx.Done():
			t.Fatal("a new stream delivered nothing")
		}
	}
}
