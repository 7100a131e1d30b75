package suite

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/base/basetest"
	"github.com/leaderfeed/leaderfeed/mongo"
)

// gated holds the next Subscribe until the test opens the gate, so that
// writes land while no stream is open.
type gated struct {
	backend.Election
	st   *mongo.Store
	mu   sync.Mutex
	gate chan struct{} // nil: no gate
}

func (g *gated) close(gate chan struct{}) {
	g.mu.Lock()
	g.gate = gate
	g.mu.Unlock()
}

func (g *gated) Subscribe(ctx context.Context) (<-chan backend.Notification, error) {
	g.mu.Lock()
	gate := g.gate
	g.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return g.Election.Subscribe(ctx)
}

// startFeed starts a Feed on b and returns its events; Stop runs at cleanup.
func startFeed(t *testing.T, b backend.Election, node string, observe bool) (*base.Feed, <-chan base.Event) {
	t.Helper()
	f, err := base.New(b, node, base.Options{Timing: basetest.ScaledTiming(basetest.FastTiming), ObserveOnly: observe})
	if err != nil {
		t.Fatalf("base.New: %v", err)
	}
	events := f.Events()
	if err := f.Start(testCtx(t)); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { stopFeed(t, f, events) })
	return f, events
}

// stopFeed stops f while it reads the remaining events (Stop delivers
// them before it returns).
func stopFeed(t *testing.T, f *base.Feed, events <-chan base.Event) {
	t.Helper()
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		for range events {
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := f.Stop(ctx); err != nil {
		t.Errorf("Stop: %v", err)
	}
	<-drained
}

// waitEvent returns the first event that pass accepts, failing after 10 s.
func waitEvent(t *testing.T, events <-chan base.Event, what string, pass func(base.Event) bool) base.Event {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case e, ok := <-events:
			if !ok {
				t.Fatalf("events closed while waiting for %s", what)
			}
			if pass(e) {
				return e
			}
		case <-timeout:
			t.Fatalf("no %s within 10 s", what)
		}
	}
}

func isType(typ base.EventType) func(base.Event) bool {
	return func(e base.Event) bool { return e.Type == typ }
}

// A change stream that breaks under a Feed is reported, reopened by the
// Feed, and resumed from its token: nothing written meanwhile is lost.
func testFeedStreamResumedWithoutLoss(t *testing.T, newServer NewServer) {
	s := newServer(t)
	el := electionName(t)
	writer := s.started(t, el)
	gb, gst := s.feedBackend(t, el, mongo.Options{})
	g := &gated{Election: gb, st: gst}
	_, events := startFeed(t, g, "observer", true)
	waitEvent(t, events, "subscribe started", isType(base.EventSubscribeStarted))

	r := mustBeat(t, writer, none, rec("x", 1, "addr-x"))
	waitEvent(t, events, "new leader x", func(e base.Event) bool { return e.Type == base.EventNewLeader && e.Leader == "x" })
	ctx := testCtx(t)
	if err := s.Put(ctx, "before", bson.M{"n": 0}); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, events, "change before", func(e base.Event) bool { return e.Type == base.EventChange })

	gate := make(chan struct{})
	g.close(gate)
	s.killStreams(g.st)
	waitEvent(t, events, "subscribe error", isType(base.EventSubscribeError))
	// Written while the stream is down.
	var keys []string
	for i := range 5 {
		keys = append(keys, fmt.Sprintf("gap-%d", i))
		if err := s.Put(ctx, keys[i], bson.M{"n": i}); err != nil {
			t.Fatal(err)
		}
	}
	r = mustBeat(t, writer, r, rec("", 1, ""))
	mustBeat(t, writer, r, rec("y", 2, "addr-y"))
	close(gate)

	// The Feed may learn of y by polling while its stream is down, before
	// the changes arrive: collect both in any order.
	var got []string
	sawY := false
	for len(got) < len(keys) || !sawY {
		e := waitEvent(t, events, "the changes made during the gap and leader y", func(e base.Event) bool {
			return e.Type == base.EventChange || e.Type == base.EventNewLeader
		})
		if e.Type == base.EventChange {
			got = append(got, strings.Trim(string(e.Change.Key), `"`))
		} else if e.Leader == "y" && e.Term == 2 {
			sawY = true
		}
	}
	if strings.Join(got, ",") != strings.Join(keys, ",") {
		t.Fatalf("changes after the reopen: %v, want %v", got, keys)
	}
}

// A foreign document with the election's _id is reported as ignored; the
// Feed goes on, and leads once the document is gone.
func testFeedMalformedRecordIgnored(t *testing.T, newServer NewServer) {
	s := newServer(t)
	el := electionName(t)
	ctx := testCtx(t)
	for i, doc := range []bson.M{{"leader": 5}, {"something": "else"}} {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			if err := s.Put(ctx, el, doc); err != nil {
				t.Fatal(err)
			}
			b, _ := s.feedBackend(t, el, mongo.Options{})
			f, events := startFeed(t, b, "node", false)
			// The Ignored may come from the Feed's first read, before its
			// stream is open: wait for both.
			var ignored, started bool
			for !ignored || !started {
				e := waitEvent(t, events, "ignored and subscribe started", func(e base.Event) bool {
					if e.Type == base.EventElected {
						t.Fatal("elected over a foreign document")
					}
					return e.Type == base.EventIgnored || e.Type == base.EventSubscribeStarted
				})
				if e.Type == base.EventIgnored {
					if !errors.Is(e.Err, backend.ErrMalformedRecord) {
						t.Fatalf("Ignored with %v, want ErrMalformedRecord", e.Err)
					}
					ignored = true
				} else {
					started = true
				}
			}
			if err := s.Put(ctx, el+"-user", bson.M{"n": i}); err != nil {
				t.Fatal(err)
			}
			waitEvent(t, events, "a change after the ignored record", isType(base.EventChange))
			if f.IsLeader() {
				t.Fatal("leads over a foreign document")
			}
			if err := s.Delete(ctx, el); err != nil {
				t.Fatal(err)
			}
			waitEvent(t, events, "elected after the foreign document went", isType(base.EventElected))
			stopFeed(t, f, events)
			if err := s.Delete(ctx, el); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A user document of 1 MiB reaches a Feed as a change with the whole
// document.
func testFeedHugeDocument(t *testing.T, newServer NewServer) {
	s := newServer(t)
	b, _ := s.feedBackend(t, electionName(t), mongo.Options{})
	_, events := startFeed(t, b, "node", true)
	waitEvent(t, events, "subscribe started", isType(base.EventSubscribeStarted))
	blob := strings.Repeat("y", 1<<20)
	if err := s.Put(testCtx(t), "huge", bson.M{"blob": blob}); err != nil {
		t.Fatal(err)
	}
	e := waitEvent(t, events, "the huge change", isType(base.EventChange))
	var doc struct{ Blob string }
	if err := json.Unmarshal(e.Change.New, &doc); err != nil || doc.Blob != blob {
		t.Fatalf("huge document arrived with %d bytes of JSON (%v)", len(e.Change.New), err)
	}
}

// Two Feeds on two backends elect exactly one leader, and the other
// follows it.
func testFeedTwoNodes(t *testing.T, newServer NewServer) {
	s := newServer(t)
	el := electionName(t)
	ba, _ := s.feedBackend(t, el, mongo.Options{})
	bb, _ := s.feedBackend(t, el, mongo.Options{})
	fa, ea := startFeed(t, ba, "a", false)
	fb, eb := startFeed(t, bb, "b", false)
	leader := func(e base.Event) bool { return e.Type == base.EventNewLeader && e.Leader != "" }
	la := waitEvent(t, ea, "a leader seen by a", leader)
	lb := waitEvent(t, eb, "a leader seen by b", leader)
	if la.Leader != lb.Leader || la.Term != lb.Term {
		t.Fatalf("a sees %s (term %d), b sees %s (term %d)", la.Leader, la.Term, lb.Leader, lb.Term)
	}
	if fa.IsLeader() && fb.IsLeader() {
		t.Fatal("both lead")
	}
}
