package base_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/memory"
)

// A Feed whose notifications pile up in its loop's mailbox (here the loop
// is held in a Trace callback while other records change thousands of
// times) must fail its changefeed, report it, and reopen it, rather than
// queue without bound.
func TestFeedFallsBehindFailsAndReopens(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewDB()
		els := newElections(t, store)
		defer els.Close()
		block := make(chan struct{})
		var hold atomic.Bool
		tr := &base.Trace{Event: func(ei base.EventInfo) {
			if ei.Event.Type == base.EventChange && hold.CompareAndSwap(true, false) {
				<-block
			}
		}}
		f, err := els.Feed("e", "observer", base.Options{Timing: timing, Trace: tr, ObserveOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		sub := f.Subscribe(context.Background())
		if err := f.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		hold.Store(true)
		if err := store.Put("first", 0); err != nil { // the loop stops in Trace
			t.Fatal(err)
		}
		synctest.Wait()
		for i := range 5000 {
			if err := store.Put(fmt.Sprint("k", i), i); err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait()
		close(block)
		time.Sleep(10 * timing.ElectionTimeoutMax) // the feed reopens after a backoff
		synctest.Wait()
		if err := f.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		var changes, failed, started int
		for e := range sub.C {
			switch e.Type {
			case base.EventChange:
				changes++
			case base.EventSubscribeError:
				if strings.Contains(e.Err.Error(), "behind") {
					failed++
				}
			case base.EventSubscribeStarted:
				started++
			}
		}
		if failed != 1 || started != 2 || changes > 4097 {
			t.Fatalf("%d changes, %d failures for falling behind, %d opens of the feed; want at most 4097 changes, 1 failure, 2 opens", changes, failed, started)
		}
	})
}
