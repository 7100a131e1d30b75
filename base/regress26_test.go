package base_test

// Regression tests of the faults of tracker issue 26, each found by an
// independent review and reproduced under testing/synctest on the memory
// backend.

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/faulty"
	"github.com/leaderfeed/leaderfeed/memory"
)

// Fault 4: a reader of Events that reads every event (10 ms each) gets the
// EventUnelected of Stop, however many events were queued when Stop came,
// and nothing is dropped.
func TestRegress26StopKeepsEventsForReader(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		b, _ := store.Backend("e")
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
		store := memory.NewStore()
		b, _ := store.Backend("e")
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
		store := memory.NewStore()
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
