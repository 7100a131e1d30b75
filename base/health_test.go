package base_test

// Tests of Feed.Healthy and Options.Trace, under
// testing/synctest with the memory backend wrapped in base/faulty.

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/base/faulty"
	"github.com/leaderfeed/leaderfeed/memory"
)

// node starts a feed named id on store's election "e", wrapped in faulty.
func node(t *testing.T, store *memory.DB, id string, opts base.Options) (*base.Feed, *faulty.Backend) {
	t.Helper()
	b, _ := store.Election("e")
	fb := faulty.Wrap(b)
	opts.Timing = timing
	f, err := base.New(fb, id, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Stop(context.Background()) })
	return f, fb
}

func waitLeader(f *base.Feed) {
	for !f.IsLeader() {
		time.Sleep(time.Millisecond)
	}
}

func TestHealthyLifecycle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, _ := memory.NewDB().Election("e")
		f, err := base.New(b, "n", base.Options{Timing: timing})
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Healthy(0); !errors.Is(err, base.ErrNotStarted) {
			t.Fatalf("Healthy before Start: %v, want ErrNotStarted", err)
		}
		if err := f.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		waitLeader(f)
		// A healthy leader stays healthy however long it leads.
		time.Sleep(10 * base.DefaultHealthBound(timing))
		if err := f.Healthy(0); err != nil {
			t.Fatalf("Healthy of a leader: %v", err)
		}
		h := f.Health()
		if h.Started.IsZero() || h.FeedDownSince != (time.Time{}) || time.Since(h.LastRecord) > timing.HeartbeatInterval {
			t.Fatalf("Health of a leader renewing every %v: %+v", timing.HeartbeatInterval, h)
		}
		if err := f.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := f.Healthy(0); !errors.Is(err, base.ErrClosed) {
			t.Fatalf("Healthy after Stop: %v, want ErrClosed", err)
		}
	})
}

// A leader whose renewals fail is unhealthy once they have failed for
// longer than the bound (shorter than its lease here), and a follower on
// a healthy election is healthy.
func TestHealthyRenewalsFailing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewDB()
		l, fb := node(t, store, "a", base.Options{})
		waitLeader(l)
		fol, _ := node(t, store, "b", base.Options{})
		time.Sleep(3 * timing.ElectionTimeoutMax)
		if err := fol.Healthy(0); err != nil {
			t.Fatalf("follower: %v", err)
		}
		bound := timing.LeaseDuration / 2
		fb.Inject(faulty.Fault{Method: faulty.MethodHeartbeat, Err: errors.New("disk full")})
		time.Sleep(timing.HeartbeatInterval) // the first renewal fails
		synctest.Wait()
		if err := l.Healthy(bound); err != nil {
			t.Fatalf("Healthy right after the first failed renewal: %v", err)
		}
		// Unhealthy once they have failed for longer than the bound: the
		// first failure may have come at the very end of the sleep above.
		time.Sleep(bound + time.Millisecond)
		synctest.Wait()
		err := l.Healthy(bound)
		if !errors.Is(err, base.ErrUnhealthy) || !strings.Contains(err.Error(), "renewals of term") {
			t.Fatalf("Healthy(%v) of a leader whose renewals fail: %v, want ErrUnhealthy naming the renewals", bound, err)
		}
	})
}

// A follower cut off from the store (feed broken, reads failing) is
// unhealthy after the bound, and healthy again once the store answers.
func TestHealthyPartitioned(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewDB()
		l, _ := node(t, store, "a", base.Options{})
		waitLeader(l)
		f, fb := node(t, store, "b", base.Options{})
		time.Sleep(timing.ElectionTimeoutMax)
		fb.Partition()
		bound := base.DefaultHealthBound(timing)
		time.Sleep(bound / 2)
		synctest.Wait()
		if err := f.Healthy(0); err != nil {
			t.Fatalf("Healthy within the bound: %v", err)
		}
		time.Sleep(bound)
		synctest.Wait()
		err := f.Healthy(0)
		if !errors.Is(err, base.ErrUnhealthy) || !strings.Contains(err.Error(), "changefeed down") {
			t.Fatalf("Healthy of a partitioned follower: %v, want ErrUnhealthy naming the changefeed", err)
		}
		fb.Heal()
		time.Sleep(timing.ElectionTimeoutMax)
		synctest.Wait()
		if err := f.Healthy(0); err != nil {
			t.Fatalf("Healthy after the partition healed: %v", err)
		}
	})
}

// A node whose store calls hang while its changefeed stays open (and
// silent) is unhealthy for want of any answer.
func TestHealthyNoContact(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewDB()
		f, fb := node(t, store, "a", base.Options{})
		waitLeader(f)
		fb.Inject(faulty.Fault{Method: faulty.MethodHeartbeat, Hang: true})
		fb.Inject(faulty.Fault{Method: faulty.MethodGet, Hang: true})
		bound := base.DefaultHealthBound(timing)
		time.Sleep(bound + timing.ElectionTimeoutMax)
		synctest.Wait()
		if f.IsLeader() {
			t.Fatal("still leader with every renewal hanging")
		}
		if h := f.Health(); !h.FeedDownSince.IsZero() {
			t.Fatalf("the feed went down (%+v); the test wants it open and silent", h)
		}
		err := f.Healthy(0)
		if !errors.Is(err, base.ErrUnhealthy) || !strings.Contains(err.Error(), "no answer from the store") {
			t.Fatalf("Healthy with every call hanging: %v, want ErrUnhealthy naming the silence", err)
		}
		// An observer with an open feed in a silent election is healthy.
		o, _ := node(t, store, "o", base.Options{ObserveOnly: true})
		time.Sleep(2 * bound)
		if err := o.Healthy(0); err != nil {
			t.Fatalf("observer with an open feed: %v", err)
		}
	})
}

// traceLog records what a Trace is told.
type traceLog struct {
	mu     sync.Mutex
	claims []base.ClaimInfo
	renews []base.RenewInfo
	events []base.EventInfo
}

func (tl *traceLog) trace() *base.Trace {
	return &base.Trace{
		ClaimDone: func(c base.ClaimInfo) { tl.mu.Lock(); tl.claims = append(tl.claims, c); tl.mu.Unlock() },
		RenewDone: func(r base.RenewInfo) { tl.mu.Lock(); tl.renews = append(tl.renews, r); tl.mu.Unlock() },
		Event:     func(e base.EventInfo) { tl.mu.Lock(); tl.events = append(tl.events, e); tl.mu.Unlock() },
	}
}

func TestTrace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewDB()
		var ta, tb traceLog
		a, fa := node(t, store, "a", base.Options{Trace: ta.trace()})
		waitLeader(a)
		delay := 3 * time.Millisecond
		fa.Inject(faulty.Fault{Method: faulty.MethodHeartbeat, Nth: 1, Delay: delay})
		fa.Inject(faulty.Fault{Method: faulty.MethodHeartbeat, Nth: 2, Err: errors.New("boom")})
		time.Sleep(5 * timing.HeartbeatInterval)
		// b sees a's record, then hears nothing more: its claim, on a
		// stale revision, loses.
		b, fb := node(t, store, "b", base.Options{Trace: tb.trace()})
		time.Sleep(timing.HeartbeatInterval)
		synctest.Wait()
		fb.Inject(faulty.Fault{Method: faulty.MethodSubscribe, Err: errors.New("no feed")})
		fb.Inject(faulty.Fault{Method: faulty.MethodGet, Err: errors.New("no reads")})
		fb.BreakFeed(nil)
		time.Sleep(2 * timing.ElectionTimeoutMax)
		synctest.Wait()
		_ = b
		if err := a.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}

		ta.mu.Lock()
		defer ta.mu.Unlock()
		if len(ta.claims) != 1 || !ta.claims[0].Won || ta.claims[0].Err != nil || ta.claims[0].Term != 1 ||
			ta.claims[0].Election != "e" || ta.claims[0].NodeID != "a" {
			t.Fatalf("a's claims: %+v, want one won, term 1, by a in e", ta.claims)
		}
		if len(ta.renews) < 5 {
			t.Fatalf("a's renewals: %d traced, want at least 5", len(ta.renews))
		}
		if r := ta.renews[0]; r.Err != nil || r.Latency != delay || r.Term != 1 || r.Election != "e" || r.NodeID != "a" {
			t.Fatalf("first renewal %+v, want no error and latency %v, by a in e", r, delay)
		}
		if r := ta.renews[1]; r.Err == nil || !strings.Contains(r.Err.Error(), "boom") {
			t.Fatalf("second renewal %+v, want the injected error", r)
		}
		var leadership []string
		for _, e := range ta.events {
			if e.Election != "e" || e.NodeID != "a" {
				t.Fatalf("a's event %+v names another Feed", e)
			}
			if e.Event.Type == base.EventElected || e.Event.Type == base.EventUnelected {
				leadership = append(leadership, e.Event.String())
			}
		}
		if want := []string{"elected term=1", "unelected term=1 reason=stopped"}; !slices.Equal(leadership, want) {
			t.Fatalf("a's leadership events %q, want %q (Stop's last event too)", leadership, want)
		}
		tb.mu.Lock()
		defer tb.mu.Unlock()
		if !slices.ContainsFunc(tb.events, func(e base.EventInfo) bool { return e.Event.Type == base.EventSubscribeError }) {
			t.Fatalf("b's events %+v: no subscribe-error for its broken feed", tb.events)
		}
		lost := 0
		for _, c := range tb.claims {
			if c.Won {
				t.Fatalf("b won a claim on a stale revision: %+v", c)
			}
			if c.Election != "e" || c.NodeID != "b" {
				t.Fatalf("b's claim %+v names another Feed", c)
			}
			if errors.Is(c.Err, backend.ErrConflict) {
				lost++
			}
		}
		if lost == 0 {
			t.Fatalf("b's claims %+v: none lost to a conflict", tb.claims)
		}
	})
}
