package base_test

// Regression tests of the faults of tracker issue 26, each found by an
// independent review and reproduced under testing/synctest on the memory
// backend.

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
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

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
