package base_test

// Regression tests of the faults measured in tracker issue 12 ("Core engine
// v2"). Each runs under testing/synctest: time is fake, so the timings are
// exact and nothing sleeps for real.

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/base/basetest"
	"github.com/leaderfeed/leaderfeed/base/faulty"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/memory"
)

// other returns the node of c that is not n (c has two campaigners).
func other(c *basetest.Cluster, n *basetest.Node) *basetest.Node {
	for _, m := range c.Nodes {
		if m != n && !strings.HasPrefix(m.ID, "observer") {
			return m
		}
	}
	return nil
}

// Fault 1: Resign or Stop right after a renewal whose reply was lost must
// still write the vacancy (adopting the committed revision), so that the
// other node takes over at once.
func TestRegressLostRenewReplyThenResign(t *testing.T) {
	for _, how := range []string{"resign", "stop"} {
		t.Run(how, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memory.NewDB()
				c := cluster(t, store, timing, 2)
				l := c.WaitLeader(t, wait)
				// With the feed down, the leader learns of its own
				// committed renewal only from a conflict.
				l.Faulty.Inject(faulty.Fault{Method: faulty.MethodSubscribe, Err: errors.New("feed refused")})
				l.Faulty.BreakFeed(nil)
				synctest.Wait()
				calls := l.Faulty.Calls(faulty.MethodHeartbeat)
				l.Faulty.Inject(faulty.Fault{Method: faulty.MethodHeartbeat, Nth: 1, After: true})
				for l.Faulty.Calls(faulty.MethodHeartbeat) == calls {
					time.Sleep(time.Millisecond)
				}
				synctest.Wait()
				var err error
				if how == "resign" {
					err = l.Feed.Resign(context.Background())
				} else {
					err = l.Feed.Stop(context.Background())
				}
				if err != nil {
					t.Fatalf("%s: %v", how, err)
				}
				start := time.Now()
				c.WaitLeader(t, wait, l)
				if d := time.Since(start); d >= timing.ElectionTimeoutMin {
					t.Fatalf("next leader after %v, want at once (no vacancy was written)", d)
				}
			})
		})
	}
}

// solo starts one node on a faulty-wrapped memory backend and returns it
// with a subscription to its events; the test stops it.
func solo(t *testing.T) (*base.Feed, *faulty.Backend, *base.Subscription) {
	b, _ := memory.NewDB().Election("e")
	fb := faulty.Wrap(b)
	f, err := base.New(fb, "n", base.Options{Timing: timing})
	if err != nil {
		t.Fatal(err)
	}
	sub := f.Subscribe(context.Background())
	if err := f.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	for !f.IsLeader() {
		time.Sleep(time.Millisecond)
	}
	return f, fb, sub
}

// Fault 2: a Stop whose context ends while a store call hangs must not drop
// EventUnelected for a reader that reads.
func TestRegressStopDuringHungCallKeepsUnelected(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, fb, sub := solo(t)
		fb.Inject(faulty.Fault{Method: faulty.MethodHeartbeat, Hang: true})
		time.Sleep(timing.HeartbeatInterval + time.Millisecond) // a renewal hangs
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
		defer cancel()
		_ = f.Stop(sctx)
		var got []base.Event
		for e := range sub.C {
			got = append(got, e)
		}
		if len(got) == 0 || got[len(got)-1].Type != base.EventUnelected {
			t.Fatalf("events %v, want the last to be unelected", got)
		}
	})
}

// Fault 3: while the first Subscribe hangs (and the first read failed), a
// node must poll the record.
func TestRegressPollsWhileFirstSubscribeHangs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewDB()
		b, _ := store.Election("e")
		fb := faulty.Wrap(b)
		fb.Inject(faulty.Fault{Method: faulty.MethodSubscribe, Hang: true})
		fb.Inject(faulty.Fault{Method: faulty.MethodGet, Nth: 1})
		obs, err := base.New(fb, "observer", base.Options{Timing: timing, ObserveOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		if err := obs.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		defer obs.Stop(context.Background())
		w, _ := store.Election("e")
		defer w.Close()
		if _, err := w.Heartbeat(context.Background(), heartbeat.Record{}, heartbeat.Record{Election: "e", Leader: "someone", Term: 1}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * timing.HeartbeatInterval)
		if r, ok := obs.Leader(); !ok || r.Leader != "someone" {
			t.Fatalf("observer sees %v (%v) five heartbeat intervals after a leader was written, want it to poll", r, ok)
		}
	})
}

// gatedClose blocks Close until gate is closed.
type gatedClose struct {
	backend.Election
	entered chan struct{}
	gate    chan struct{}
}

func (g *gatedClose) Close() error {
	close(g.entered)
	<-g.gate
	return g.Election.Close()
}

// Fault 4: a second, concurrent Stop waits for the first to finish.
func TestRegressConcurrentStopWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, _ := memory.NewDB().Election("e")
		g := &gatedClose{Election: b, entered: make(chan struct{}), gate: make(chan struct{})}
		f, _ := base.New(g, "n", base.Options{Timing: timing})
		if err := f.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(timing.ElectionTimeoutMin)
		first := make(chan error, 1)
		go func() { first <- f.Stop(context.Background()) }()
		<-g.entered
		second := make(chan error, 1)
		go func() { second <- f.Stop(context.Background()) }()
		synctest.Wait()
		select {
		case err := <-second:
			t.Fatalf("second Stop returned %v while the first was still closing the backend", err)
		default:
		}
		close(g.gate)
		if err := <-first; err != nil {
			t.Fatal(err)
		}
		if err := <-second; err != nil {
			t.Fatal(err)
		}
	})
}

// Fault 5: a vacancy whose reply was lost was written all the same: Resign
// returns nil and the resigner does not claim its own vacancy.
func TestRegressLostVacancyReply(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := cluster(t, memory.NewDB(), timing, 2)
		l := c.WaitLeader(t, wait)
		synctest.Wait()
		l.Faulty.Inject(faulty.Fault{Method: faulty.MethodHeartbeat, Nth: 1, After: true})
		if err := l.Feed.Resign(context.Background()); err != nil {
			t.Fatalf("Resign: %v, want nil (the vacancy was written)", err)
		}
		n := c.WaitLeader(t, wait, l)
		if n != other(c, l) {
			t.Fatalf("%s leads, want %s", n.ID, other(c, l).ID)
		}
	})
}

// Fault 6: a deposed leader reports its EventUnelected before the
// EventNewLeader of the node that took over.
func TestRegressUnelectedBeforeNewLeader(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewDB()
		c := cluster(t, store, timing, 1)
		l := c.WaitLeader(t, wait)
		rec, _ := l.Feed.Leader()
		w, _ := store.Election(c.Election)
		defer w.Close()
		if _, err := w.Heartbeat(context.Background(), rec, heartbeat.Record{Election: c.Election, Leader: "usurper", Term: rec.Term + 1}); err != nil {
			t.Fatal(err)
		}
		_, ui := l.WaitEvent(t, 0, wait, "unelected", func(e base.Event) bool { return e.Type == base.EventUnelected })
		_, ni := l.WaitEvent(t, 0, wait, "new-leader usurper", func(e base.Event) bool { return e.Type == base.EventNewLeader && e.Leader == "usurper" })
		if ni < ui {
			t.Fatalf("new-leader usurper (#%d) before unelected (#%d): %v", ni, ui, l.Events())
		}
	})
}

// lateReply commits the first n writes but returns their replies after
// delay (ignoring the caller's context), as a store slower than the lease.
type lateReply struct {
	backend.Election
	mu    sync.Mutex
	n     int
	delay time.Duration
}

func (s *lateReply) Heartbeat(ctx context.Context, rev, next heartbeat.Record) (heartbeat.Record, error) {
	res, err := s.Election.Heartbeat(ctx, rev, next)
	s.mu.Lock()
	late := s.n > 0
	s.n--
	s.mu.Unlock()
	if late {
		time.Sleep(s.delay)
	}
	return res, err
}

// Fault 7: a claim that commits but whose reply comes after its lease must
// not stall the election for another election timeout.
func TestRegressLateClaimDoesNotStall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, _ := memory.NewDB().Election("e")
		lb := &lateReply{Election: b, n: 1, delay: timing.LeaseDuration + 5*time.Millisecond}
		f, _ := base.New(lb, "n", base.Options{Timing: timing})
		if err := f.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		defer f.Stop(context.Background())
		start := time.Now()
		for !f.IsLeader() {
			if time.Since(start) > timing.ElectionTimeoutMin {
				t.Fatalf("no leader %v after a late claim, want it renewed or released at once", time.Since(start))
			}
			time.Sleep(time.Millisecond)
		}
	})
}

// Fault 8: Resign(context.Background()) on a hung store must not block the
// Feed: Proclaim answers ErrNotLeader and Stop returns within its context.
func TestRegressResignOnHungStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, fb, sub := solo(t)
		defer sub.Close()
		synctest.Wait()
		fb.Inject(faulty.Fault{Method: faulty.MethodHeartbeat, Hang: true})
		resigned := make(chan error, 1)
		go func() { resigned <- f.Resign(context.Background()) }()
		synctest.Wait()
		pctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		if err := f.Proclaim(pctx, []byte("x")); !errors.Is(err, base.ErrNotLeader) {
			t.Fatalf("Proclaim during a hung Resign: %v, want ErrNotLeader", err)
		}
		sctx, cancel2 := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel2()
		start := time.Now()
		_ = f.Stop(sctx)
		if d := time.Since(start); d > 10*time.Millisecond {
			t.Fatalf("Stop took %v, beyond its context", d)
		}
		<-resigned
	})
}

// Fault 9: Stop does not wait for a reader of Events that never reads.
func TestRegressStopWithUnreadEvents(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, _ := memory.NewDB().Election("e")
		f, _ := base.New(b, "n", base.Options{Timing: timing})
		events := f.Events()
		sctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		_ = f.Subscribe(sctx)
		if err := f.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(timing.ElectionTimeoutMax)
		done := make(chan error, 1)
		go func() { done <- f.Stop(context.Background()) }()
		time.Sleep(time.Millisecond)
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatal("Stop waits for a reader of Events that never reads")
		}
		// What Events held is dropped and counted once nobody took it
		// for ElectionTimeoutMin; then its channel closes.
		time.Sleep(timing.ElectionTimeoutMin)
		synctest.Wait()
		if f.Dropped() == 0 {
			t.Error("Dropped() = 0 after the unread events of Events were let go")
		}
		if _, ok := <-events; ok {
			t.Error("Events delivered an event after it dropped what it held")
		}
	})
}

// A claim whose reply comes back after the feed has already delivered the
// claimed record: the node must report EventElected before it reports itself
// as the new leader (found as an ordering flake of the Example functions).
func TestRegressElectedBeforeOwnNewLeader(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewDB()
		b, _ := store.Election("e")
		// A leader that never renews: the node claims only after its
		// election timeout, when its feed is surely open, so the feed
		// brings the claimed record before the delayed reply.
		gone, _ := store.Election("e")
		if _, err := gone.Heartbeat(context.Background(), heartbeat.Record{}, heartbeat.Record{Election: "e", Leader: "gone", Term: 1}); err != nil {
			t.Fatal(err)
		}
		lb := &lateReply{Election: b, n: 1, delay: timing.HeartbeatInterval / 2}
		f, _ := base.New(lb, "n", base.Options{Timing: timing})
		sub := f.Subscribe(context.Background())
		if err := f.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		for !f.IsLeader() {
			time.Sleep(time.Millisecond)
		}
		synctest.Wait()
		if err := f.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		var elected bool
		for e := range sub.C {
			switch {
			case e.Type == base.EventElected:
				elected = true
			case e.Type == base.EventNewLeader && e.Leader == "n" && !elected:
				t.Fatalf("new-leader %q term %d before its own elected event", e.Leader, e.Term)
			}
		}
		if !elected {
			t.Fatal("no elected event")
		}
	})
}

// Fault 11: nodes of one election with different timings (a rolling change
// of Timing). A leader with a long lease stops reaching the store; a node
// whose own election timeout is shorter than that lease must still wait
// until the lease written in the record could have ended.
func TestRegressMixedTimingsNeverOverlap(t *testing.T) {
	long := heartbeat.Timing{HeartbeatInterval: 50 * time.Millisecond, LeaseDuration: 300 * time.Millisecond,
		ElectionTimeoutMin: 400 * time.Millisecond, ElectionTimeoutMax: 450 * time.Millisecond}
	short := heartbeat.Timing{HeartbeatInterval: 10 * time.Millisecond, LeaseDuration: 20 * time.Millisecond,
		ElectionTimeoutMin: 40 * time.Millisecond, ElectionTimeoutMax: 50 * time.Millisecond}
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewDB()
		checker := basetest.NewChecker()
		start := func(id string, tm heartbeat.Timing) (*base.Feed, *faulty.Backend) {
			b, _ := store.Election("e")
			fb := faulty.Wrap(b)
			f, err := base.New(fb, id, base.Options{Timing: tm})
			if err != nil {
				t.Fatal(err)
			}
			sub := f.Subscribe(context.Background())
			go func() {
				for e := range sub.C {
					checker.Observe(id, e)
				}
			}()
			if err := f.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = f.Stop(context.Background()) })
			return f, fb
		}
		slow, slowB := start("slow", long)
		for !slow.IsLeader() {
			time.Sleep(time.Millisecond)
		}
		fast, _ := start("fast", short)
		time.Sleep(100 * time.Millisecond) // fast follows slow's renewals
		lctx, _, ok := slow.LeaderContext()
		if !ok {
			synctest.Wait()
			t.Fatalf("slow lost leadership before the fault: fast claimed between its renewals, inside its lease; checker: %v", checker.Check())
		}
		// Every renewal of slow hangs from now on: it leads until its last
		// lease ends, at most 300 ms from now.
		slowB.Inject(faulty.Fault{Method: faulty.MethodHeartbeat, Hang: true})
		cut := time.Now()
		for !fast.IsLeader() {
			if time.Since(cut) > 2*long.ElectionTimeoutMax {
				t.Fatalf("fast did not lead %v after slow's renewals stopped", time.Since(cut))
			}
			time.Sleep(time.Millisecond)
		}
		if lctx.Err() == nil {
			t.Fatalf("fast leads %v after the cut while slow's leader context is live", time.Since(cut))
		}
		if d := time.Since(cut); d < heartbeat.FollowerWait(long.LeaseDuration)-long.HeartbeatInterval {
			t.Fatalf("fast claimed %v after slow's last renewal, before slow's lease of %v could have ended", d, long.LeaseDuration)
		}
		synctest.Wait()
		if err := checker.Check(); err != nil {
			t.Fatal(err)
		}
	})
}

// A Proclaim made while a renewal is in flight must be answered by a
// renewal that carries its value, not by the one in flight (which carries
// the old value): when Proclaim returns nil, the store holds the new value.
// Before, the renewal in flight answered it, and the value was written by
// the next one, after Proclaim had returned (or never, if that one failed).
func TestRegressProclaimDuringRenewal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, fb, sub := solo(t)
		defer sub.Close()
		defer f.Stop(context.Background())
		calls := fb.Calls(faulty.MethodHeartbeat)
		fb.Inject(faulty.Fault{Method: faulty.MethodHeartbeat, Delay: timing.HeartbeatInterval / 4})
		for fb.Calls(faulty.MethodHeartbeat) == calls {
			time.Sleep(time.Millisecond / 10)
		}
		// A renewal carrying the old value is in flight.
		if err := f.Proclaim(context.Background(), []byte("new")); err != nil {
			t.Fatalf("Proclaim: %v", err)
		}
		rec, err := fb.Unwrap().Get(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if string(rec.Value) != "new" {
			t.Fatalf("Proclaim returned nil while the store holds %q, want %q", rec.Value, "new")
		}
	})
}
