package base

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"testing/synctest"
)

// A reader that lets more than maxPendingEvents events other than
// changes wait is cut off: its channel closes without them and Err says
// ErrSlowReader. Change events beyond MaxPendingChanges are dropped and
// counted instead; the reader then gets the rest, in order.
func TestSubscriptionSlowReader(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHub(3, slog.New(slog.DiscardHandler))
		s := newSubscription(context.Background(), h, 3, 0)
		h.subs[s] = struct{}{}
		for i := range 5 {
			h.push([]Event{{Type: EventChange, Term: uint64(i)}})
		}
		h.push([]Event{{Type: EventNewLeader, Term: 9}})
		synctest.Wait()
		if s.Dropped() != 2 || h.dropped.Load() != 2 {
			t.Fatalf("Dropped %d, hub %d: want the 2 changes beyond 3", s.Dropped(), h.dropped.Load())
		}
		for i, want := range []uint64{0, 1, 2, 9} {
			if e := <-s.C; e.Term != want {
				t.Fatalf("event %d: %v, want term %d", i, e, want)
			}
		}
		for i := range maxPendingEvents + 1 {
			h.push([]Event{{Type: EventNewLeader, Term: uint64(i)}})
		}
		synctest.Wait()
		n := 0
		for range s.C {
			n++
		}
		if !errors.Is(s.Err(), ErrSlowReader) || n > 1 {
			t.Fatalf("Err %v after %d events delivered past the bound; want ErrSlowReader, at most the one in hand", s.Err(), n)
		}
		synctest.Wait()
		if len(h.subs) != 0 {
			t.Fatal("the subscription did not leave the hub")
		}
	})
}

// A burst (one take's events) keeps its order; the change events beyond
// maxChanges in the middle of it are dropped and counted, and the events
// after them still come.
func TestSubscriptionBurst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHub(2, slog.New(slog.DiscardHandler))
		s := newSubscription(context.Background(), h, 2, 0)
		h.subs[s] = struct{}{}
		h.push([]Event{
			{Type: EventNewLeader, Term: 1},
			{Type: EventChange, Term: 2},
			{Type: EventChange, Term: 3},
			{Type: EventChange, Term: 4},
			{Type: EventElected, Term: 5},
		})
		synctest.Wait()
		if s.Dropped() != 1 {
			t.Fatalf("Dropped %d, want the 1 change beyond 2", s.Dropped())
		}
		for i, want := range []uint64{1, 2, 3, 5} {
			if e := <-s.C; e.Term != want {
				t.Fatalf("event %d: %v, want term %d", i, e, want)
			}
		}
		s.Close()
	})
}
