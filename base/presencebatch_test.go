package base_test

// Tests of the batched presence calls of an Elections (its Store a
// backend.PresenceBatchStore), under testing/synctest with the memory
// backend wrapped in base/faulty.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/base/faulty"
	"github.com/leaderfeed/leaderfeed/memory"
)

// presenceCalls returns how many presence writes and reads of
// participants fs has taken, single or batched.
func presenceCalls(fs *faulty.Store) (writes, reads int) {
	return fs.Calls(faulty.MethodPresent) + fs.Calls(faulty.MethodPresentBatch),
		fs.Calls(faulty.MethodParticipants) + fs.Calls(faulty.MethodParticipantsBatch)
}

const presenceFailed = "DEBUG leaderfeed: presence refresh failed"

// participating starts n participating Feeds of node "node" on els,
// elections e00, e01..., all at once, with presence interval pi, each
// logging to its own logLines.
func participating(t *testing.T, els *base.Elections, n int, pi time.Duration) ([]*base.Feed, []*logLines) {
	t.Helper()
	feeds := make([]*base.Feed, n)
	logs := make([]*logLines, n)
	for i := range feeds {
		logs[i] = &logLines{}
		f, err := els.Feed(fmt.Sprintf("e%02d", i), "node", base.Options{Timing: timing, Participate: true, PresenceInterval: pi, Logger: slog.New(logs[i])})
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		feeds[i] = f
	}
	return feeds, logs
}

// The presence refreshes of many participating elections on one
// Elections go out in one store call per presence interval, and so do
// their leaders' reads of the participants; every election's presence
// record stays fresh. A batch that fails reports its error to the Feed of
// every election in it, a write of one election refused inside a batch to
// that election's Feed alone.
func TestElectionsBatchPresence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		db := memory.NewDB()
		fs := faulty.WrapStore(db.Conn())
		els, err := base.NewElections(fs, base.ElectionsOptions{})
		if err != nil {
			t.Fatal(err)
		}
		const n, pi = 30, 50 * time.Millisecond
		feeds, logs := participating(t, els, n, pi)
		for _, f := range feeds {
			for !f.IsLeader() {
				time.Sleep(time.Millisecond)
			}
		}
		time.Sleep(2 * pi)
		synctest.Wait()
		w0, r0 := presenceCalls(fs)
		singles := fs.Calls(faulty.MethodPresent) + fs.Calls(faulty.MethodParticipants)
		const intervals = 20
		time.Sleep(intervals * pi)
		synctest.Wait()
		w1, r1 := presenceCalls(fs)
		if w, r := w1-w0, r1-r0; w > intervals+1 || r > intervals+1 || w < intervals-1 || r < intervals-1 {
			t.Fatalf("%d elections in %d presence intervals: %d presence write calls and %d reads of participants, want one of each per interval", n, intervals, w, r)
		}
		if more := fs.Calls(faulty.MethodPresent) + fs.Calls(faulty.MethodParticipants) - singles; more != 0 {
			t.Fatalf("%d presence calls of one election alone among %d elections, want none", more, n)
		}
		check := db.Conn()
		for i := range n {
			ps, now, err := check.Participants(context.Background(), fmt.Sprintf("e%02d", i))
			if err != nil || len(ps) != 1 || ps[0].Node != "node" || now.Sub(ps[0].Timestamp) > pi {
				t.Fatalf("election %d: participants %+v at %v (%v): want node, refreshed within a presence interval", i, ps, now, err)
			}
		}
		for i, l := range logs {
			if got := l.count(presenceFailed); got != 0 {
				t.Fatalf("election %d: %d presence refreshes failed with no fault in force", i, got)
			}
		}

		// A failed batch: the Feed of every election in it learns of it.
		fs.Inject(faulty.Fault{Method: faulty.MethodPresentBatch, Nth: 1})
		time.Sleep(pi)
		synctest.Wait()
		for i, l := range logs {
			if got := l.count(presenceFailed); got != 1 {
				t.Fatalf("election %d: %d failed presence refreshes logged after one batch failed, want 1", i, got)
			}
		}
		// One election's write refused inside a batch: its Feed alone.
		fs.Inject(faulty.Fault{Method: faulty.MethodPresentBatch, Election: "e03", Nth: 1})
		time.Sleep(pi)
		synctest.Wait()
		for i, l := range logs {
			want := 1
			if i == 3 {
				want = 2
			}
			if got := l.count(presenceFailed); got != want {
				t.Fatalf("election %d: %d failed presence refreshes logged after the write of e03 failed in a batch, want %d", i, got, want)
			}
		}
		stopAndClose(t, els, feeds)
	})
}

// presenceOf returns the presence capability of election on els.
func presenceOf(t *testing.T, els *base.Elections, election string, observer bool) backend.PresenceElection {
	t.Helper()
	open := els.Election
	if observer {
		open = els.Observer
	}
	b, err := open(election)
	if err != nil {
		t.Fatal(err)
	}
	return b.(backend.PresenceElection)
}

// presentWithin writes the presence of node in pe, bounded by timeout.
func presentWithin(pe backend.PresenceElection, node string, token uint64, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return pe.Present(ctx, backend.Presence{Node: node, CanLead: true, Token: token})
}

// Batches never couple elections: a write in a batch that hangs is
// answered at its own deadline, not at the batch's; a batch that hangs
// holds up no later one until maxInFlight (8) hang at once, and the
// writes that wait meanwhile are answered by their own deadline too.
// Close answers what is in flight with ErrClosed and leaves no goroutine
// (synctest).
func TestElectionsPresenceBatchesDoNotCouple(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := faulty.WrapStore(memory.NewDB().Conn())
		els, err := base.NewElections(fs, base.ElectionsOptions{})
		if err != nil {
			t.Fatal(err)
		}
		fs.Inject(faulty.Fault{Method: faulty.MethodPresentBatch, Nth: 1, Hang: true})
		start := time.Now()
		var wg sync.WaitGroup
		timeouts := []time.Duration{100 * time.Millisecond, 2 * time.Second}
		errs, took := make([]error, len(timeouts)), make([]time.Duration, len(timeouts))
		for i, d := range timeouts {
			pe := presenceOf(t, els, fmt.Sprintf("hung%d", i), false)
			wg.Go(func() {
				errs[i] = presentWithin(pe, "n", 1, d)
				took[i] = time.Since(start)
			})
		}
		time.Sleep(60 * time.Millisecond) // past the window: the batch hangs
		synctest.Wait()
		if got := fs.Calls(faulty.MethodPresentBatch); got != 1 {
			t.Fatalf("%d batches sent, want the one that hangs", got)
		}
		// Two other elections' writes go through meanwhile.
		var wg2 sync.WaitGroup
		for i := range 2 {
			pe := presenceOf(t, els, fmt.Sprintf("free%d", i), false)
			wg2.Go(func() {
				if err := presentWithin(pe, "n", 1, 200*time.Millisecond); err != nil {
					t.Errorf("a write while another batch hangs: %v", err)
				}
			})
		}
		wg2.Wait()
		if d := time.Since(start); d > 60*time.Millisecond+2*50*time.Millisecond {
			t.Fatalf("the writes beside a hung batch took until %v", d)
		}
		wg.Wait()
		for i, d := range timeouts {
			if !errors.Is(errs[i], context.DeadlineExceeded) || took[i] != d {
				t.Fatalf("write %d of the hung batch: %v after %v, want its own deadline's error after %v", i, errs[i], took[i], d)
			}
		}

		// Every batch hangs: 8 are in flight, the 9th waits, and its
		// writes are answered by their own deadline.
		fs.Inject(faulty.Fault{Method: faulty.MethodPresentBatch, Hang: true})
		base0 := fs.Calls(faulty.MethodPresentBatch)
		var hung sync.WaitGroup
		hungErrs := make([]error, 16)
		for round := range 8 {
			for j := range 2 {
				pe := presenceOf(t, els, fmt.Sprintf("r%d-%d", round, j), false)
				hung.Go(func() { hungErrs[2*round+j] = presentWithin(pe, "n", 1, time.Hour) })
			}
			time.Sleep(60 * time.Millisecond)
			synctest.Wait()
		}
		if got := fs.Calls(faulty.MethodPresentBatch) - base0; got != 8 {
			t.Fatalf("%d batches in flight, want 8", got)
		}
		for j := range 2 {
			pe := presenceOf(t, els, fmt.Sprintf("late%d", j), false)
			if err := presentWithin(pe, "n", 1, 300*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("a write while 8 batches hang: %v, want its deadline's error", err)
			}
		}
		if got := fs.Calls(faulty.MethodPresentBatch) - base0; got != 8 {
			t.Fatalf("%d batches sent while 8 hang, want 8", got)
		}
		after := presenceOf(t, els, "after", false)
		if err := els.Close(); err != nil {
			t.Fatal(err)
		}
		hung.Wait()
		for i, err := range hungErrs {
			if !errors.Is(err, base.ErrClosed) {
				t.Fatalf("write %d in flight at Close: %v, want ErrClosed", i, err)
			}
		}
		if err := presentWithin(after, "n", 1, time.Second); !errors.Is(err, base.ErrClosed) {
			t.Fatalf("a write after Close: %v, want ErrClosed", err)
		}
	})
}

// Absent waits for a batch in flight that writes the same presence
// record, though the write's caller gave up on it (Stop deletes the
// record after the refresh in flight, at most its deadline): the write
// does not commit after the delete and list a stopped node as live.
func TestElectionsAbsentAfterBatchInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		db := memory.NewDB()
		fs := faulty.WrapStore(db.Conn())
		els, err := base.NewElections(fs, base.ElectionsOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer els.Close()
		gone, other := presenceOf(t, els, "gone", false), presenceOf(t, els, "other", false)
		// The batch takes 100 ms and goes through; the write of "gone"
		// gives up after 20 ms, the other's waits a second.
		fs.Inject(faulty.Fault{Method: faulty.MethodPresentBatch, Nth: 1, Delay: 100 * time.Millisecond})
		var wg sync.WaitGroup
		wg.Go(func() {
			if err := presentWithin(other, "n", 1, time.Second); err != nil {
				t.Errorf("the patient write: %v", err)
			}
		})
		if err := presentWithin(gone, "n", 1, 20*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("the write that gives up: %v, want its deadline's error", err)
		}
		start := time.Now()
		err = gone.Absent(context.Background(), "n")
		waited := time.Since(start)
		wg.Wait()
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		if ps, _, err := db.Conn().Participants(context.Background(), "gone"); err != nil || len(ps) != 0 {
			t.Fatalf("participants of the election after Absent: %+v, %v; want none (Absent waited %v for the batch in flight)", ps, err, waited)
		}
	})
}

// Two writes of one presence record in a batch (a Feed and an observer
// with one node id) are one write, the later; both callers get its
// result. An Elections with NoBatch writes each presence alone.
func TestElectionsPresenceBatchOneWritePerRecord(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		db := memory.NewDB()
		fs := faulty.WrapStore(db.Conn())
		els, err := base.NewElections(fs, base.ElectionsOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer els.Close()
		var wg sync.WaitGroup
		for i, observer := range []bool{false, true} {
			pe := presenceOf(t, els, "e", observer)
			wg.Go(func() {
				if err := presentWithin(pe, "n", uint64(i+1), time.Second); err != nil {
					t.Errorf("write %d: %v", i, err)
				}
			})
		}
		wg.Wait()
		if w, _ := presenceCalls(fs); w != 1 {
			t.Fatalf("%d store calls for two writes of one record in one window, want 1", w)
		}
		ps, _, err := db.Conn().Participants(context.Background(), "e")
		if err != nil || len(ps) != 1 || (ps[0].Token != 1 && ps[0].Token != 2) {
			t.Fatalf("participants %+v, %v; want n with the token of one of the writes", ps, err)
		}

		alone := faulty.WrapStore(db.Conn())
		plain, err := base.NewElections(alone, base.ElectionsOptions{NoBatch: true})
		if err != nil {
			t.Fatal(err)
		}
		defer plain.Close()
		for i := range 3 {
			pe := presenceOf(t, plain, fmt.Sprintf("p%d", i), false)
			wg.Go(func() {
				if err := presentWithin(pe, "n", 1, time.Second); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if single, batches := alone.Calls(faulty.MethodPresent), alone.Calls(faulty.MethodPresentBatch); single != 3 || batches != 0 {
			t.Fatalf("NoBatch: %d single presence writes and %d batches for 3 writes, want 3 and 0", single, batches)
		}
	})
}
