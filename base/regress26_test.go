package base_test

// Regression tests of the faults of tracker issue 26, each found by an
// independent review and reproduced under testing/synctest on the memory
// backend.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/faulty"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/memory"
)

// Fault 4: a reader of Events that reads every event (10 ms each) gets the
// EventUnelected of Stop, however many events were queued when Stop came,
// and nothing is dropped.
func TestRegress26StopKeepsEventsForReader(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewDB()
		b, _ := store.Election("e")
		f, err := base.New(b, "n", base.Options{Timing: timing})
		if err != nil {
			t.Fatal(err)
		}
		events := f.Events()
		got := make(chan []base.Event, 1)
		go func() {
			var all []base.Event
			for e := range events {
				all = append(all, e)
				time.Sleep(10 * time.Millisecond)
			}
			got <- all
		}()
		if err := f.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		for !f.IsLeader() {
			time.Sleep(time.Millisecond)
		}
		for i := range 20 { // change events queue up behind the slow reader
			if err := store.Put(fmt.Sprint("job-", i), i); err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait() // the changes are queued for the reader
		if err := f.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		all := <-got
		changes, unelected := 0, false
		for _, e := range all {
			changes += btoi(e.Type == base.EventChange)
			unelected = unelected || (e.Type == base.EventUnelected && e.Reason == base.ReasonStopped)
		}
		if !unelected || changes != 20 {
			t.Errorf("events %v: want the 20 changes and unelected (stopped)", all)
		}
		if n := f.Dropped(); n != 0 {
			t.Errorf("Dropped() = %d for a reader that reads", n)
		}
	})
}

// Fault 6: a Proclaim refused (ErrNotLeader: the lease ran out while a
// renewal hung) has no later effect: the next term publishes the value in
// force before it.
func TestRegress26RefusedProclaimHasNoEffect(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewDB()
		b, _ := store.Election("e")
		fb := faulty.Wrap(b)
		f, err := base.New(fb, "n", base.Options{Timing: timing, Value: []byte("v1")})
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		defer f.Stop(context.Background())
		for !f.IsLeader() {
			time.Sleep(time.Millisecond)
		}
		term, _ := f.Term()
		fb.Inject(faulty.Fault{Method: faulty.MethodHeartbeat, Hang: true})
		time.Sleep(timing.HeartbeatInterval + time.Millisecond) // a renewal hangs
		if err := f.Proclaim(context.Background(), []byte("v2")); !errors.Is(err, base.ErrNotLeader) {
			t.Fatalf("Proclaim while the renewal hangs to the lease's end: %v, want ErrNotLeader", err)
		}
		fb.Heal()
		for {
			if t2, ok := f.Term(); ok && t2 > term {
				break
			}
			time.Sleep(time.Millisecond)
		}
		time.Sleep(3 * timing.HeartbeatInterval)
		r, err := store.Conn().Get(context.Background(), "e")
		if err != nil {
			t.Fatal(err)
		}
		if string(r.Value) != "v1" {
			t.Errorf("the next term publishes %q, want %q (the Proclaim of %q was refused)", r.Value, "v1", "v2")
		}
	})
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Fault 5: a node's view never goes back. A resigns, B claims the vacancy
// at once, and A's reply to its vacancy comes 50 ms late: A must neither
// announce its own vacancy after B, nor show it in Leader().
func TestRegress26ViewNeverGoesBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewDB()
		c := cluster(t, store, timing, 2)
		a := c.WaitLeader(t, wait)
		b := other(c, a)
		synctest.Wait()
		a.Faulty.Inject(faulty.Fault{Method: faulty.MethodHeartbeat, Nth: 1, DelayReply: 50 * time.Millisecond})
		from := len(a.Events())
		if err := a.Feed.Resign(context.Background()); err != nil {
			t.Fatal(err)
		}
		// Resign returns with the late reply taken in.
		bTerm, _ := b.Feed.Term()
		if bTerm == 0 {
			t.Fatalf("%s does not lead 50 ms after the vacancy", b.ID)
		}
		if r, _ := a.Feed.Leader(); r.Leader != b.ID || r.Term != bTerm {
			t.Errorf("%s's Leader() is %v while %s leads term %d", a.ID, r, b.ID, bTerm)
		}
		synctest.Wait()
		var leaders []string
		sawB := false
		for _, e := range a.Events()[from:] {
			if e.Type != base.EventNewLeader {
				continue
			}
			leaders = append(leaders, fmt.Sprintf("%q term %d", e.Leader, e.Term))
			if sawB && (e.Leader != b.ID || e.Term != bTerm) {
				t.Errorf("%s announced %v after resigning: back from %s's term %d", a.ID, leaders, b.ID, bTerm)
			}
			sawB = sawB || (e.Leader == b.ID && e.Term == bTerm)
		}
		if !sawB {
			t.Errorf("%s announced %v after resigning, never %s", a.ID, leaders, b.ID)
		}
	})
}

// batchProcess is one process with a batching Elections on a faulty
// wrapper of a memory DB's connection, and a Feed of node "p" in each
// of the elections named.
func batchProcess(t *testing.T, store *memory.DB, timings map[string]heartbeat.Timing) (*faulty.Store, map[string]*base.Feed) {
	t.Helper()
	fs := faulty.WrapStore(store.Conn())
	els, err := base.NewElections(fs, base.ElectionsOptions{})
	if err != nil {
		t.Fatal(err)
	}
	feeds := make(map[string]*base.Feed)
	for name, tm := range timings {
		f, err := els.Feed(name, "p", base.Options{Timing: tm, Rand: rand.New(rand.NewPCG(1, uint64(len(feeds))))})
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		feeds[name] = f
	}
	t.Cleanup(func() {
		for _, f := range feeds {
			_ = f.Stop(context.Background())
		}
		_ = els.Close()
	})
	for _, f := range feeds {
		for !f.IsLeader() {
			time.Sleep(time.Millisecond)
		}
	}
	return fs, feeds
}

// Fault 1: a process leads x and y on one batching Elections; its writes
// are black-holed for a while, during which x resigns with a long context.
// Once the store answers again, y leads again at once: the vacancy of x,
// hanging until its context ends, holds up no write of y.
func TestRegress26HungWriteHoldsUpNoOtherElection(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs, feeds := batchProcess(t, memory.NewDB(), map[string]heartbeat.Timing{"x": timing, "y": timing})
		fs.Inject(faulty.Fault{Method: faulty.MethodHeartbeat, Hang: true})
		fs.Inject(faulty.Fault{Method: faulty.MethodHeartbeatBatch, Hang: true})
		resigned := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			resigned <- feeds["x"].Resign(ctx)
		}()
		time.Sleep(10 * timing.LeaseDuration)
		if feeds["y"].IsLeader() {
			t.Fatal("y leads with every write black-holed")
		}
		fs.Heal() // the calls in flight still hang, to their deadlines
		healed := time.Now()
		for !feeds["y"].IsLeader() {
			if time.Since(healed) > timing.ElectionTimeoutMax+5*timing.HeartbeatInterval {
				t.Fatalf("y has no leader %v after the store answers again, behind x's hung vacancy", time.Since(healed))
			}
			time.Sleep(time.Millisecond)
		}
		<-resigned
	})
}

// Fault 2: the leader of x (another process) is gone; this process's
// claim of x hangs to its deadline (the lease). y, led by this process and
// never faulted, keeps its lease all along.
func TestRegress26HungClaimHoldsUpNoRenewal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewDB()
		// The other process leads x, then crashes: it never writes again.
		other, _ := store.Election("x")
		defer other.Close()
		if _, err := other.Heartbeat(context.Background(), heartbeat.Record{}, heartbeat.Record{Election: "x", Leader: "q", Term: 1, Lease: timing.LeaseDuration}); err != nil {
			t.Fatal(err)
		}
		fs := faulty.WrapStore(store.Conn())
		fs.Inject(faulty.Fault{Method: faulty.MethodHeartbeat, Election: "x", Nth: 1, Hang: true})
		els, err := base.NewElections(fs, base.ElectionsOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer els.Close()
		y, _ := els.Feed("y", "p", base.Options{Timing: timing, Rand: rand.New(rand.NewPCG(1, 1))})
		if err := y.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		defer y.Stop(context.Background())
		for !y.IsLeader() {
			time.Sleep(time.Millisecond)
		}
		term, _ := y.Term()
		x, _ := els.Feed("x", "p", base.Options{Timing: timing, Rand: rand.New(rand.NewPCG(1, 2))})
		if err := x.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		defer x.Stop(context.Background())
		for fs.Calls(faulty.MethodHeartbeat+"/x") == 0 {
			if got, ok := y.Term(); !ok || got != term {
				t.Fatalf("y lost its lease of term %d before x claimed", term)
			}
			time.Sleep(time.Millisecond)
		}
		// x's claim hangs; y renews all along, and x leads once its claim
		// has timed out.
		for !x.IsLeader() {
			if got, ok := y.Term(); !ok || got != term {
				t.Fatalf("y lost its lease of term %d while x's claim hung", term)
			}
			time.Sleep(time.Millisecond)
		}
	})
}

// Fault 3: elections of very different timings on one batching Elections,
// no fault: each renewal waits by its own timing, so the fast election
// keeps its lease whatever the slow one's renewals do to the batches.
func TestRegress26RenewalWaitsByItsOwnTiming(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		slow := heartbeat.Timing{HeartbeatInterval: 4 * time.Second, LeaseDuration: 8 * time.Second, ElectionTimeoutMin: 10 * time.Second, ElectionTimeoutMax: 12 * time.Second}
		fast := heartbeat.Timing{HeartbeatInterval: 100 * time.Millisecond, LeaseDuration: 150 * time.Millisecond, ElectionTimeoutMin: 200 * time.Millisecond, ElectionTimeoutMax: 300 * time.Millisecond}
		_, feeds := batchProcess(t, memory.NewDB(), map[string]heartbeat.Timing{"slow": slow, "fast": fast})
		term, _ := feeds["fast"].Term()
		for start := time.Now(); time.Since(start) < 60*time.Second; {
			if got, ok := feeds["fast"].Term(); !ok || got != term {
				t.Fatalf("the fast election lost its lease of term %d after %v", term, time.Since(start))
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}
