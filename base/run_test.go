package base_test

// Tests of Feed.Run, under testing/synctest on the memory backend: time is
// fake, so the timings are exact and nothing sleeps for real. synctest.Test
// also fails a test that leaves a goroutine of its bubble behind.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/faulty"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/memory"
)

// runNode is one node whose Feed runs under Run on its own goroutine.
type runNode struct {
	id     string
	feed   *base.Feed
	link   *faulty.Backend
	cancel context.CancelCauseFunc
	result chan error // Run's result
}

// newRunNode makes a node of election e on store (not started).
func newRunNode(t *testing.T, store *memory.DB, id string) *runNode {
	t.Helper()
	b, err := store.Election("e")
	if err != nil {
		t.Fatal(err)
	}
	n := &runNode{id: id, link: faulty.Wrap(b), result: make(chan error, 1)}
	if n.feed, err = base.New(n.link, id, base.Options{Timing: timing}); err != nil {
		t.Fatal(err)
	}
	return n
}

// run starts Run on the node's goroutine; the test's cleanup ends it.
func (n *runNode) run(t *testing.T, fn func(ctx context.Context, term uint64) error) *runNode {
	ctx, cancel := context.WithCancelCause(context.Background())
	n.cancel = cancel
	go func() { n.result <- n.feed.Run(ctx, fn) }()
	t.Cleanup(func() {
		cancel(nil)
		_ = n.feed.Stop(context.Background())
	})
	return n
}

// wait returns Run's result, failing the test if it takes longer than d.
func (n *runNode) wait(t *testing.T, d time.Duration) error {
	t.Helper()
	select {
	case err := <-n.result:
		return err
	case <-time.After(d):
		t.Fatalf("%s: Run has not returned after %v", n.id, d)
		return nil
	}
}

// span is one call of fn: who ran it, for which term, from when to when
// (the moment it saw its ctx done), and why it ended.
type span struct {
	node       string
	term       uint64
	start, end time.Time
	cause      error
}

func (s span) String() string {
	return fmt.Sprintf("%s term %d [%v, %v] %v", s.node, s.term, s.start.Format("05.000"), s.end.Format("05.000"), s.cause)
}

// journal records the calls of fn of several nodes.
type journal struct {
	mu      sync.Mutex
	spans   []span
	started chan span // every start, buffered
	ended   chan span // every end, buffered
}

func newJournal() *journal {
	return &journal{started: make(chan span, 100), ended: make(chan span, 100)}
}

// fn returns the function a node runs: it checks, every millisecond, that
// the node leads while its ctx is live, and records its span.
func (j *journal) fn(t *testing.T, n *runNode) func(ctx context.Context, term uint64) error {
	return func(ctx context.Context, term uint64) error {
		s := span{node: n.id, term: term, start: time.Now()}
		if got, ok := n.feed.Term(); !ok || got != term {
			t.Errorf("%s: fn of term %d started while Term() is %d, %v", n.id, term, got, ok)
		}
		j.started <- s
		for {
			leading := n.feed.IsLeader()
			if ctx.Err() != nil {
				break
			}
			if !leading {
				t.Errorf("%s: fn of term %d runs, its ctx live, while the node does not lead", n.id, term)
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Millisecond):
			}
		}
		s.end, s.cause = time.Now(), context.Cause(ctx)
		j.mu.Lock()
		j.spans = append(j.spans, s)
		j.mu.Unlock()
		j.ended <- s
		return ctx.Err()
	}
}

// check fails the test if two spans overlap.
func (j *journal) check(t *testing.T) {
	t.Helper()
	j.mu.Lock()
	defer j.mu.Unlock()
	for i, a := range j.spans {
		for _, b := range j.spans[i+1:] {
			if a.start.Before(b.end) && b.start.Before(a.end) {
				t.Errorf("two fns at once: %v and %v", a, b)
			}
		}
	}
}

func next[T any](t *testing.T, c <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(wait):
		t.Fatalf("no %s within %v", what, wait)
		var zero T
		return zero
	}
}

// fn runs only while its node leads: it starts in the node's term, and
// its ctx ends with leadership (here on Resign, which hands over to the
// other node, and on a partition, which the other node outlasts).
func TestRunFnOnlyWhileLeading(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewDB()
		j := newJournal()
		a := newRunNode(t, store, "a")
		a.run(t, j.fn(t, a))
		s := next(t, j.started, "start")
		if s.node != "a" || s.term != 1 {
			t.Fatalf("first fn: %v, want a term 1", s)
		}
		b := newRunNode(t, store, "b")
		b.run(t, j.fn(t, b))
		time.Sleep(5 * timing.ElectionTimeoutMax)

		if err := a.feed.Resign(context.Background()); err != nil {
			t.Fatal(err)
		}
		if e := next(t, j.ended, "end"); e.node != "a" || !errors.Is(e.cause, base.ErrResigned) {
			t.Fatalf("ended: %v, want a with ErrResigned", e)
		}
		if s := next(t, j.started, "start"); s.node != "b" || s.term != 2 {
			t.Fatalf("after Resign: %v, want b term 2", s)
		}
		time.Sleep(5 * timing.ElectionTimeoutMax)

		b.link.Partition()
		if e := next(t, j.ended, "end"); e.node != "b" || !errors.Is(e.cause, base.ErrLeaseExpired) {
			t.Fatalf("ended: %v, want b with ErrLeaseExpired", e)
		}
		if s := next(t, j.started, "start"); s.node != "a" || s.term != 3 {
			t.Fatalf("after the partition: %v, want a term 3", s)
		}
		b.link.Heal()
		time.Sleep(5 * timing.ElectionTimeoutMax)
		a.cancel(nil)
		b.cancel(nil)
		for _, n := range []*runNode{a, b} {
			if err := n.wait(t, wait); err != nil {
				t.Errorf("%s: Run: %v", n.id, err)
			}
		}
		j.check(t)
	})
}

// fn's ctx ends when leadership does, context.Cause saying why, and Run
// campaigns again: fn runs again in a later term.
func TestRunCancelsFnWhenLeadershipEnds(t *testing.T) {
	for _, tc := range []struct {
		name  string
		end   func(t *testing.T, store *memory.DB, n *runNode)
		heal  func(n *runNode)
		cause error
		// bound is how long after end the ctx must be done.
		bound time.Duration
	}{
		{"resigned", func(t *testing.T, _ *memory.DB, n *runNode) {
			if err := n.feed.Resign(context.Background()); err != nil {
				t.Fatal(err)
			}
		}, nil, base.ErrResigned, 0},
		{"deposed", func(t *testing.T, store *memory.DB, n *runNode) {
			rec, _ := n.feed.Leader()
			w, _ := store.Election("e")
			defer w.Close()
			if _, err := w.Heartbeat(context.Background(), rec, heartbeat.Record{Election: "e", Leader: "usurper", Term: rec.Term + 1}); err != nil {
				t.Fatal(err)
			}
		}, nil, base.ErrDeposed, 0},
		{"lease expired", func(t *testing.T, _ *memory.DB, n *runNode) {
			n.link.Partition()
		}, func(n *runNode) { n.link.Heal() }, base.ErrLeaseExpired, timing.LeaseDuration},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memory.NewDB()
				j := newJournal()
				n := newRunNode(t, store, "n")
				n.run(t, j.fn(t, n))
				first := next(t, j.started, "start")
				time.Sleep(timing.HeartbeatInterval / 2) // between renewals
				at := time.Now()
				tc.end(t, store, n)
				e := next(t, j.ended, "end")
				if !errors.Is(e.cause, tc.cause) {
					t.Fatalf("fn's ctx ended with cause %v, want %v", e.cause, tc.cause)
				}
				if d := e.end.Sub(at); d > tc.bound {
					t.Fatalf("fn's ctx ended %v after leadership did, want at most %v", d, tc.bound)
				}
				if tc.heal != nil {
					tc.heal(n)
				}
				again := next(t, j.started, "start after the end of leadership")
				if again.term <= first.term {
					t.Fatalf("fn ran again in term %d, want above %d", again.term, first.term)
				}
				n.cancel(nil)
				if err := n.wait(t, wait); err != nil {
					t.Fatalf("Run: %v", err)
				}
				j.check(t)
			})
		})
	}
}

// A term won while the previous fn is still returning starts its fn only
// once that one has returned: one fn at a time on a node.
func TestRunWaitsForThePreviousFn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newRunNode(t, memory.NewDB(), "n")
		var mu sync.Mutex
		var running int
		var terms []uint64
		returned := make(chan time.Time, 10)
		started := make(chan time.Time, 10)
		n.run(t, func(ctx context.Context, term uint64) error {
			mu.Lock()
			running++
			if running > 1 {
				t.Errorf("fn of term %d started while another runs", term)
			}
			terms = append(terms, term)
			mu.Unlock()
			started <- time.Now()
			<-ctx.Done()
			time.Sleep(10 * timing.ElectionTimeoutMax) // a slow wind-down
			mu.Lock()
			running--
			mu.Unlock()
			returned <- time.Now()
			return nil
		})
		next(t, started, "first start")
		n.link.Partition()
		time.Sleep(timing.LeaseDuration + time.Millisecond)
		n.link.Heal()
		// The node claims its own record again at once and leads in term
		// 2 long before the first fn returns.
		time.Sleep(timing.ElectionTimeoutMin)
		if term, ok := n.feed.Term(); !ok || term != 2 {
			t.Fatalf("Term() = %d, %v; want 2, true", term, ok)
		}
		r := next(t, returned, "return of the first fn")
		s := next(t, started, "start of the second fn")
		if s.Before(r) {
			t.Fatalf("second fn started at %v, before the first returned at %v", s, r)
		}
		n.cancel(nil)
		next(t, returned, "return of the second fn")
		if err := n.wait(t, wait); err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(terms) != "[1 2]" {
			t.Fatalf("terms %v, want [1 2]", terms)
		}
	})
}

// When fn panics, Run recovers, stops the Feed (handing over at once) and
// returns a *PanicError with the value and the stack.
func TestRunPanic(t *testing.T) {
	for _, value := range []any{"boom", errBoom} {
		t.Run(fmt.Sprint(value), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memory.NewDB()
				j := newJournal()
				a := newRunNode(t, store, "a")
				panicNow := make(chan struct{})
				a.run(t, func(ctx context.Context, term uint64) error {
					<-panicNow
					panic(value)
				})
				for !a.feed.IsLeader() {
					time.Sleep(time.Millisecond)
				}
				b := newRunNode(t, store, "b")
				b.run(t, j.fn(t, b))
				time.Sleep(timing.ElectionTimeoutMax)
				at := time.Now()
				close(panicNow)
				err := a.wait(t, wait)
				var pe *base.PanicError
				if !errors.As(err, &pe) {
					t.Fatalf("Run returned %v, want a *PanicError", err)
				}
				if pe.Value != value || pe.Term != 1 || !strings.Contains(string(pe.Stack), "run_test.go") {
					t.Fatalf("PanicError{%v, %d, %s}, want the value, term 1 and the stack of fn", pe.Value, pe.Term, pe.Stack)
				}
				if !strings.Contains(err.Error(), "run_test.go") {
					t.Fatalf("the message has no stack: %v", err)
				}
				if _, isErr := value.(error); isErr && !errors.Is(err, errBoom) {
					t.Fatalf("errors.Is(%v, errBoom) is false", err)
				}
				select {
				case <-a.feed.Done():
				default:
					t.Fatal("the Feed still runs after Run returned")
				}
				s := next(t, j.started, "b's start")
				if d := s.start.Sub(at); s.node != "b" || d >= timing.ElectionTimeoutMin {
					t.Fatalf("%v, %v after the panic; want b at once (a vacancy)", s, d)
				}
			})
		})
	}
}

var errBoom = errors.New("boom")

// When fn returns while its node still leads, the work is over: Run stops
// the Feed, handing over at once, and returns what fn returned.
func TestRunFnReturnsWhileLeading(t *testing.T) {
	for _, ret := range []error{errBoom, nil} {
		t.Run(fmt.Sprint(ret), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memory.NewDB()
				j := newJournal()
				a := newRunNode(t, store, "a")
				quit := make(chan struct{})
				a.run(t, func(ctx context.Context, term uint64) error {
					<-quit
					return ret
				})
				for !a.feed.IsLeader() {
					time.Sleep(time.Millisecond)
				}
				b := newRunNode(t, store, "b")
				b.run(t, j.fn(t, b))
				time.Sleep(timing.ElectionTimeoutMax)
				at := time.Now()
				close(quit)
				if err := a.wait(t, wait); !errors.Is(err, ret) || (ret == nil && err != nil) {
					t.Fatalf("Run returned %v, want %v", err, ret)
				}
				s := next(t, j.started, "b's start")
				if d := s.start.Sub(at); d >= timing.ElectionTimeoutMin {
					t.Fatalf("b started %v after a's fn returned, want at once", d)
				}
			})
		})
	}
}

var errShutdown = errors.New("shutting down")

// When Run's ctx ends, fn's ctx ends with its cause; Run waits for fn,
// the node leading until fn returned, then stops the Feed and returns nil.
func TestRunContextEnd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewDB()
		j := newJournal()
		a := newRunNode(t, store, "a")
		windDown := 30 * time.Millisecond // under the lease: renewals go on
		var returned time.Time
		a.run(t, func(ctx context.Context, term uint64) error {
			<-ctx.Done()
			if !errors.Is(context.Cause(ctx), errShutdown) {
				t.Errorf("cause %v, want errShutdown", context.Cause(ctx))
			}
			time.Sleep(windDown)
			if !a.feed.IsLeader() {
				t.Error("the node gave up leadership before fn returned")
			}
			returned = time.Now()
			return ctx.Err()
		})
		for !a.feed.IsLeader() {
			time.Sleep(time.Millisecond)
		}
		b := newRunNode(t, store, "b")
		b.run(t, j.fn(t, b))
		time.Sleep(timing.ElectionTimeoutMax)
		at := time.Now()
		a.cancel(errShutdown)
		if err := a.wait(t, wait); err != nil {
			t.Fatalf("Run: %v", err)
		}
		if d := time.Since(at); d != windDown {
			t.Fatalf("Run returned %v after its ctx ended, want %v (fn's wind-down)", d, windDown)
		}
		select {
		case <-a.feed.Done():
		default:
			t.Fatal("the Feed still runs after Run returned")
		}
		s := next(t, j.started, "b's start")
		if s.start.Before(returned) || s.start.Sub(returned) >= timing.ElectionTimeoutMin {
			t.Fatalf("b started at %v, a's fn returned at %v: want b after, at once", s.start, returned)
		}
	})
}

// In a cluster of three, fn runs on one node at a time, through
// partitions of the leader and restarts of nodes.
func TestRunOneFnAtATimeInACluster(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewDB()
		j := newJournal()
		nodes := map[string]*runNode{}
		start := func(id string) {
			n := newRunNode(t, store, id)
			nodes[id] = n.run(t, j.fn(t, n))
		}
		for _, id := range []string{"a", "b", "c"} {
			start(id)
		}
		cur := next(t, j.started, "first start")
		for round := range 12 {
			time.Sleep(2 * timing.ElectionTimeoutMax)
			n := nodes[cur.node]
			restart := round%3 == 1
			if restart { // the leader's program ends, and starts again
				n.cancel(nil)
				if err := n.wait(t, wait); err != nil {
					t.Fatalf("%s: Run: %v", n.id, err)
				}
			} else { // the leader is cut off the store
				n.link.Partition()
			}
			next(t, j.ended, "end")
			s := next(t, j.started, "start")
			if s.term <= cur.term || s.node == cur.node {
				t.Fatalf("after %v: %v, want another node in a later term", cur, s)
			}
			if restart {
				start(n.id)
			} else {
				n.link.Heal()
			}
			cur = s
		}
		j.check(t)
		for _, n := range nodes {
			n.cancel(nil)
			if err := n.wait(t, wait); err != nil {
				t.Errorf("%s: Run: %v", n.id, err)
			}
		}
	})
}

// A program that never reads its events (Events and a subscription both
// left unread) stops in milliseconds when Run's ctx ends.
func TestRunStopsAtOnceWithUnreadEvents(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewDB()
		n := newRunNode(t, store, "n")
		_ = n.feed.Events()
		sctx, cancel := context.WithCancel(context.Background())
		defer cancel() // an unread subscription lasts until its ctx ends
		_ = n.feed.Subscribe(sctx)
		started := make(chan struct{}, 10)
		n.run(t, func(ctx context.Context, term uint64) error {
			started <- struct{}{}
			<-ctx.Done()
			return nil
		})
		next(t, started, "start")
		w, _ := store.Election("e") // change events for the readers too
		defer w.Close()
		for i := range 100 {
			if err := store.Put(fmt.Sprint("job-", i), i); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(10 * timing.ElectionTimeoutMax)
		at := time.Now()
		n.cancel(nil)
		if err := n.wait(t, time.Millisecond); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(at); d > 0 {
			t.Fatalf("Run took %v to return, want no wait", d)
		}
	})
}

// The same on the clock of the machine, with the default timing.
func TestRunStopsAtOnceRealTime(t *testing.T) {
	b, _ := memory.NewDB().Election("e")
	f, err := base.New(b, "n", base.Options{})
	if err != nil {
		t.Fatal(err)
	}
	_ = f.Events()
	ctx, cancel := context.WithCancel(context.Background())
	result := make(chan error, 1)
	started := make(chan struct{})
	go func() {
		result <- f.Run(ctx, func(ctx context.Context, term uint64) error {
			close(started)
			<-ctx.Done()
			return nil
		})
	}()
	<-started
	at := time.Now()
	cancel()
	select {
	case err := <-result:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Second): // milliseconds, but CI machines can be loaded
		t.Fatal("Run has not returned 2 s after its ctx ended")
	}
	t.Logf("Run returned %v after its ctx ended", time.Since(at))
}

// A Stop called while Run runs ends fn (ErrStopped) and Run, which
// returns ErrClosed.
func TestRunFeedStoppedUnderIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newRunNode(t, memory.NewDB(), "n")
		j := newJournal()
		n.run(t, j.fn(t, n))
		next(t, j.started, "start")
		if err := n.feed.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		if e := next(t, j.ended, "end"); !errors.Is(e.cause, base.ErrStopped) {
			t.Fatalf("cause %v, want ErrStopped", e.cause)
		}
		if err := n.wait(t, wait); !errors.Is(err, base.ErrClosed) {
			t.Fatalf("Run: %v, want ErrClosed", err)
		}
	})
}

func TestRunRejectsBadUse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewDB()
		noop := func(ctx context.Context, term uint64) error { <-ctx.Done(); return nil }
		ctx := context.Background()

		n := newRunNode(t, store, "n")
		if err := n.feed.Run(ctx, nil); !errors.Is(err, base.ErrInvalidConfig) {
			t.Errorf("nil fn: %v, want ErrInvalidConfig", err)
		}

		b, _ := store.Election("e")
		obs, _ := base.New(b, "obs", base.Options{Timing: timing, ObserveOnly: true})
		if err := obs.Run(ctx, noop); !errors.Is(err, base.ErrObserveOnly) {
			t.Errorf("observe-only: %v, want ErrObserveOnly", err)
		}
		_ = obs.Stop(ctx)
		if err := obs.Run(ctx, noop); !errors.Is(err, base.ErrObserveOnly) {
			t.Errorf("observe-only, stopped: %v, want ErrObserveOnly", err)
		}

		// A failed Start (refused: a transient failure is waited for)
		// leaves the Feed unstarted: Run can be called again.
		n.link.Inject(faulty.Fault{Method: faulty.MethodStart, Nth: 1, Err: errRefusedWrite})
		if err := n.feed.Run(ctx, noop); !errors.Is(err, base.ErrRefused) {
			t.Errorf("Run with Start failing: %v, want the Start error", err)
		}
		started := make(chan struct{})
		n.run(t, func(ctx context.Context, term uint64) error {
			close(started)
			<-ctx.Done()
			return nil
		})
		<-started
		if err := n.feed.Run(ctx, noop); !errors.Is(err, base.ErrAlreadyStarted) {
			t.Errorf("second Run: %v, want ErrAlreadyStarted", err)
		}
		n.cancel(nil)
		if err := n.wait(t, wait); err != nil {
			t.Fatal(err)
		}
		if err := n.feed.Run(ctx, noop); !errors.Is(err, base.ErrClosed) {
			t.Errorf("Run after Run returned: %v, want ErrClosed", err)
		}
	})
}

// Run on a Feed started (and elected) before it runs fn for the current
// term, once.
func TestRunOnAStartedFeed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newRunNode(t, memory.NewDB(), "n")
		if err := n.feed.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		for !n.feed.IsLeader() {
			time.Sleep(time.Millisecond)
		}
		j := newJournal()
		n.run(t, j.fn(t, n))
		if s := next(t, j.started, "start"); s.term != 1 {
			t.Fatalf("fn of term %d, want 1", s.term)
		}
		time.Sleep(timing.ElectionTimeoutMax)
		select {
		case s := <-j.started:
			t.Fatalf("fn started twice: %v", s)
		default:
		}
		n.cancel(nil)
		if err := n.wait(t, wait); err != nil {
			t.Fatal(err)
		}
	})
}
