package base_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/base/basetest"
	"github.com/leaderfeed/leaderfeed/base/faulty"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// timing of the unit tests: a lease of 40 ms, timeouts of 100..200 ms.
var timing = heartbeat.Timing{
	HeartbeatInterval:  10 * time.Millisecond,
	ElectionTimeoutMin: 100 * time.Millisecond,
	ElectionTimeoutMax: 200 * time.Millisecond,
	LeaseDuration:      40 * time.Millisecond,
}

const wait = 5 * time.Second

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), wait)
	t.Cleanup(cancel)
	return c
}

// cluster starts n nodes on one memory DB.
func cluster(t *testing.T, store *memory.DB, tm heartbeat.Timing, n int) *basetest.Cluster {
	t.Helper()
	return basetest.NewCluster(t, func(e string) (backend.Election, error) { return store.Election(e) }, tm, n, 0)
}

func TestNewRejectsBadInput(t *testing.T) {
	store := memory.NewDB()
	b, _ := store.Election("e")
	cases := []struct {
		name    string
		backend backend.Election
		node    string
		opts    base.Options
		want    string
	}{
		{"nil backend", nil, "n", base.Options{}, "backend is nil"},
		{"empty node id", b, "", base.Options{}, "node id is empty"},
		{"node id with a newline", b, "a\nb", base.Options{}, "node id"},
		{"empty election name", unnamed{b}, "n", base.Options{}, "election name is empty"},
		{"negative heartbeat", b, "n", base.Options{Timing: heartbeat.Timing{HeartbeatInterval: -1}}, "HeartbeatInterval must be positive"},
		{"lease not shorter than the timeout", b, "n", base.Options{Timing: heartbeat.Timing{LeaseDuration: 3 * time.Second}}, "LeaseDuration (3s) must be less than ElectionTimeoutMin (2s)"},
		{"value too large", b, "n", base.Options{Value: make([]byte, heartbeat.MaxValueLen+1)}, "Value is 2049 bytes"},
		{"negative MaxPendingChanges", b, "n", base.Options{MaxPendingChanges: -1}, "MaxPendingChanges is negative"},
		{"priority above MaxPriority", b, "n", base.Options{Priority: base.MaxPriority + 1}, "Priority 101 is outside [-100, 100]"},
		{"priority below MinPriority", b, "n", base.Options{Priority: base.MinPriority - 1}, "Priority -101 is outside [-100, 100]"},
		{"negative presence interval", b, "n", base.Options{PresenceInterval: -1}, "PresenceInterval -1ns must be 0 (default) or at least 1ms"},
		{"presence TTL below the interval", b, "n", base.Options{PresenceInterval: time.Second, PresenceTTL: time.Millisecond}, "PresenceTTL (1ms) must be at least PresenceInterval (1s)"},
		{"negative hysteresis", b, "n", base.Options{PriorityHysteresis: -1}, "PriorityHysteresis (-1ns) must not be negative"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, err := base.New(tc.backend, tc.node, tc.opts)
			if f != nil || !errors.Is(err, base.ErrInvalidConfig) {
				t.Fatalf("New: %v, %v; want nil and an error matching ErrInvalidConfig", f, err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not say %q", err, tc.want)
			}
		})
	}
}

// unnamed is a backend whose election name is empty.
type unnamed struct{ backend.Election }

func (unnamed) Name() string { return "" }

func TestLifecycleErrors(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewDB()
		b, _ := store.Election("e")
		f, err := base.New(b, "n1", base.Options{Timing: timing})
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Resign(ctx(t)); !errors.Is(err, base.ErrNotStarted) {
			t.Fatalf("Resign before Start: %v, want ErrNotStarted", err)
		}
		if err := f.Start(ctx(t)); err != nil {
			t.Fatal(err)
		}
		if err := f.Start(ctx(t)); !errors.Is(err, base.ErrAlreadyStarted) {
			t.Fatalf("second Start: %v, want ErrAlreadyStarted", err)
		}
		if err := f.Stop(ctx(t)); err != nil {
			t.Fatal(err)
		}
		select {
		case <-f.Done():
		default:
			t.Fatal("Done is open after Stop returned: Stop did not wait for its goroutines")
		}
		for name, call := range map[string]func() error{
			"Start":    func() error { return f.Start(ctx(t)) },
			"Resign":   func() error { return f.Resign(ctx(t)) },
			"Proclaim": func() error { return f.Proclaim(ctx(t), nil) },
		} {
			if err := call(); !errors.Is(err, base.ErrClosed) {
				t.Errorf("%s after Stop: %v, want ErrClosed", name, err)
			}
		}
		if err := f.Stop(ctx(t)); err != nil {
			t.Fatalf("second Stop: %v", err)
		}
	})
}

func TestStopBeforeStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, _ := memory.NewDB().Election("e")
		f, _ := base.New(b, "n1", base.Options{})
		ev := f.Events()
		if err := f.Stop(ctx(t)); err != nil {
			t.Fatal(err)
		}
		if _, ok := <-ev; ok {
			t.Fatal("Events delivered after Stop of a feed never started")
		}
		if err := f.Start(ctx(t)); !errors.Is(err, base.ErrClosed) {
			t.Fatalf("Start after Stop: %v, want ErrClosed", err)
		}
	})
}

// A Start that failed (here refused: a transient failure is waited for)
// leaves the Feed unstarted, and it can be started again.
func TestStartFailureCanBeRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, _ := memory.NewDB().Election("e")
		fb := faulty.Wrap(b)
		fb.Inject(faulty.Fault{Method: faulty.MethodCreate, Nth: 1, Err: fmt.Errorf("%w: no permission", base.ErrRefused)})
		f, _ := base.New(fb, "n1", base.Options{Timing: timing})
		if err := f.Start(ctx(t)); err == nil || !strings.Contains(err.Error(), "no permission") {
			t.Fatalf("Start: %v, want the Create error", err)
		}
		if err := f.Start(ctx(t)); err != nil {
			t.Fatalf("second Start: %v", err)
		}
		if err := f.Stop(ctx(t)); err != nil {
			t.Fatal(err)
		}
	})
}

// A leader whose renewals all fail must stop counting itself leader, and
// cancel its leader context, no later than LeaseDuration after the last
// renewal it sent that succeeded.
func TestRenewErrorsStepDownBeforeLeaseEnds(t *testing.T) {
	for _, mode := range []string{"fail", "hang"} {
		t.Run(mode, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := cluster(t, memory.NewDB(), timing, 1)
				l := c.WaitLeader(t, wait)
				lctx, term, _ := l.Feed.LeaderContext()
				ft := faulty.Fault{Method: faulty.MethodHeartbeat, Hang: mode == "hang"}
				injected := time.Now()
				l.Faulty.Inject(ft)
				e, _ := l.WaitEvent(t, 0, wait, "unelected", func(e base.Event) bool { return e.Type == base.EventUnelected })
				if e.Reason != base.ReasonLeaseExpired || e.Term != term {
					t.Fatalf("unelected %v, want lease-expired of term %d", e, term)
				}
				if mode == "fail" && !errors.Is(e.Err, faulty.ErrInjected) {
					t.Errorf("unelected carries %v, want the last renewal error", e.Err)
				}
				// The last good renewal was sent before the fault was injected.
				if limit := injected.Add(timing.LeaseDuration); e.At.After(limit) {
					t.Fatalf("leadership ended at %v, %v after the lease ran out", e.At, e.At.Sub(limit))
				}
				<-lctx.Done()
				if l.Feed.IsLeader() {
					t.Fatal("IsLeader after the lease ran out")
				}
				if got := l.Faulty.Calls(faulty.MethodHeartbeat); mode == "fail" && got < 3 {
					t.Errorf("%d renewal attempts, want retries until the lease ran out", got)
				}
			})
		})
	}
}

// When the record shows another node took over, the leader steps down at
// once: on the notification, without waiting for its next renewal.
func TestConflictStepsDownAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewDB()
		slow := timing
		slow.HeartbeatInterval, slow.LeaseDuration, slow.ElectionTimeoutMin, slow.ElectionTimeoutMax = time.Second, 1500*time.Millisecond, 2*time.Second, 4*time.Second
		c := cluster(t, store, slow, 1)
		l := c.WaitLeader(t, wait)
		rec, _ := l.Feed.Leader()
		other, _ := store.Election(c.Election)
		defer other.Close()
		wrote := time.Now()
		if _, err := other.Heartbeat(ctx(t), rec, heartbeat.Record{Leader: "usurper", Term: rec.Term + 1}); err != nil {
			t.Fatal(err)
		}
		e, _ := l.WaitEvent(t, 0, wait, "unelected", func(e base.Event) bool { return e.Type == base.EventUnelected })
		if e.Reason != base.ReasonDeposed {
			t.Fatalf("reason %v, want deposed", e.Reason)
		}
		if d := e.At.Sub(wrote); d > slow.HeartbeatInterval/2 {
			t.Fatalf("stepped down %v after the takeover, want at once (heartbeat interval %v)", d, slow.HeartbeatInterval)
		}
	})
}

// A vacancy written by a resigning leader is claimed at once, not after the
// election timeout (here two seconds).
func TestVacancyClaimedAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		slow := heartbeat.Timing{} // defaults: timeouts of 2..4 s
		c := cluster(t, memory.NewDB(), slow, 2)
		l := c.WaitLeader(t, wait) // a fresh election is vacant too
		start := time.Now()
		if err := l.Feed.Resign(ctx(t)); err != nil {
			t.Fatal(err)
		}
		l2 := c.WaitLeader(t, wait, l)
		if d := time.Since(start); d > heartbeat.DefaultElectionTimeoutMin/4 {
			t.Fatalf("the vacancy was claimed after %v, want at once", d)
		}
		// The resigner did not claim its own vacancy.
		for _, e := range l.Events() {
			if e.Type == base.EventElected && e.Term > 1 {
				t.Fatalf("the resigner won term %d, want the other node (%s)", e.Term, l2.ID)
			}
		}
	})
}

// A lost reply: the renewal was written, but the leader was told it failed.
// The leader must recognise its own write and go on leading.
func TestLostReplyKeepsLeadership(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := cluster(t, memory.NewDB(), timing, 2)
		l := c.WaitLeader(t, wait)
		term, _ := l.Feed.Term()
		l.Faulty.Inject(faulty.Fault{Method: faulty.MethodHeartbeat, Nth: 1, After: true})
		deadline := time.Now().Add(10 * timing.HeartbeatInterval)
		for time.Now().Before(deadline) {
			if got, ok := l.Feed.Term(); !ok || got != term {
				t.Fatalf("leadership lost after a lost reply (term %d, leading %v)", got, ok)
			}
			time.Sleep(time.Millisecond)
		}
	})
}

// The same with the leader's feed down, so that the only way it can learn
// of its own committed write is the conflict of its next renewal: it must
// recognise the current record as its own and keep leading.
func TestLostReplyWithFeedDownKeepsLeadership(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := cluster(t, memory.NewDB(), timing, 2)
		l := c.WaitLeader(t, wait)
		c.WaitSubscribed(t)
		term, _ := l.Feed.Term()
		l.Faulty.Inject(faulty.Fault{Method: faulty.MethodSubscribe, Err: errors.New("feed refused")})
		mark := len(l.Events())
		l.Faulty.BreakFeed(nil)
		l.WaitEvent(t, mark, wait, "subscribe-error", func(e base.Event) bool { return e.Type == base.EventSubscribeError })
		calls := l.Faulty.Calls(faulty.MethodHeartbeat)
		l.Faulty.Inject(faulty.Fault{Method: faulty.MethodHeartbeat, Nth: 1, After: true})
		deadline := time.Now().Add(10 * timing.HeartbeatInterval)
		for time.Now().Before(deadline) {
			if got, ok := l.Feed.Term(); !ok || got != term {
				t.Fatalf("leadership lost after a lost reply with the feed down (term %d, leading %v)", got, ok)
			}
			time.Sleep(time.Millisecond)
		}
		if got := l.Faulty.Calls(faulty.MethodHeartbeat) - calls; got < 5 {
			t.Fatalf("%d renewals in 10 heartbeat intervals after the lost reply, want renewals to go on", got)
		}
	})
}

func TestBrokenFeedReopensAndPolls(t *testing.T) {
	// Under synctest: the fake clock keeps the count of polls exact on a
	// loaded machine.
	synctest.Test(t, func(t *testing.T) {
		c := cluster(t, memory.NewDB(), timing, 2)
		l := c.WaitLeader(t, wait)
		var f *basetest.Node
		for _, n := range c.Nodes {
			if n != l {
				f = n
			}
		}
		c.WaitSubscribed(t)
		gets := f.Faulty.Calls(faulty.MethodGet)
		// The first reopen is refused, the second takes 6 heartbeat intervals.
		f.Faulty.Inject(faulty.Fault{Method: faulty.MethodSubscribe, Nth: 1})
		f.Faulty.Inject(faulty.Fault{Method: faulty.MethodSubscribe, Nth: 2, Delay: 6 * timing.HeartbeatInterval})
		mark := len(f.Events())
		f.Faulty.BreakFeed(nil)
		_, i := f.WaitEvent(t, mark, wait, "subscribe-error", func(e base.Event) bool { return e.Type == base.EventSubscribeError })
		_, i = f.WaitEvent(t, i+1, wait, "a second subscribe-error (reopen refused)", func(e base.Event) bool { return e.Type == base.EventSubscribeError })
		f.WaitEvent(t, i+1, wait, "subscribe-started", func(e base.Event) bool { return e.Type == base.EventSubscribeStarted })
		if got := f.Faulty.Calls(faulty.MethodGet) - gets; got < 4 {
			t.Fatalf("%d reads while the feed was down for 6 heartbeat intervals, want a poll every interval and a read after reopening", got)
		}
		if c.WaitLeader(t, 0) != l {
			t.Fatal("leadership changed because a follower's feed broke")
		}
	})
}

// An Events reader that never reads must not delay renewals; change events
// beyond MaxPendingChanges are dropped and counted, transitions are not.
func TestSlowConsumerDoesNotDelayHeartbeats(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewDB()
		b, _ := store.Election("e")
		// A longer lease than the other tests: the flood of writes below
		// competes with the renewals for the memory DB's lock.
		tm := heartbeat.Timing{HeartbeatInterval: 10 * time.Millisecond, LeaseDuration: 150 * time.Millisecond, ElectionTimeoutMin: 300 * time.Millisecond, ElectionTimeoutMax: 400 * time.Millisecond}
		f, err := base.New(b, "n1", base.Options{Timing: tm, MaxPendingChanges: 10})
		if err != nil {
			t.Fatal(err)
		}
		sub := f.Subscribe(context.Background()) // not read until the end
		events := sub.C
		if err := f.Start(ctx(t)); err != nil {
			t.Fatal(err)
		}
		for !f.IsLeader() {
			time.Sleep(time.Millisecond)
		}
		term, _ := f.Term()
		rec1, _ := f.Leader()
		for i := range 2000 {
			if err := store.Put(fmt.Sprintf("k%d", i), map[string]int{"i": i}); err != nil {
				t.Fatal(err)
			}
			runtime.Gosched()
		}
		time.Sleep(10 * timing.HeartbeatInterval)
		if got, ok := f.Term(); !ok || got != term {
			// What the reader had not taken yet, without waiting for more:
			// the feed still runs, so the channel stays open.
			for drained := false; !drained; {
				select {
				case e := <-events:
					t.Log(e)
				default:
					drained = true
				}
			}
			t.Fatalf("leadership lost while the reader was idle")
		}
		rec2, _ := f.Leader()
		if rec2.Revision-rec1.Revision < 5 {
			t.Fatalf("only %d renewals in 10 heartbeat intervals with an idle reader", rec2.Revision-rec1.Revision)
		}
		if sub.Dropped() < 1000 {
			t.Fatalf("Dropped() = %d, want the change events beyond 10 dropped", sub.Dropped())
		}
		done := make(chan error, 1)
		go func() { done <- f.Stop(ctx(t)) }()
		var elected, unelected, changes int
		for e := range events {
			switch e.Type {
			case base.EventElected:
				elected++
			case base.EventUnelected:
				unelected++
			case base.EventChange:
				changes++
			}
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if elected != 1 || unelected != 1 || changes > 10 {
			t.Fatalf("delivered %d elected, %d unelected, %d changes; want 1, 1, at most 10", elected, unelected, changes)
		}
	})
}

// Stop bounded by a context: when the vacant write hangs, Stop returns the
// context's error once it ends, and still leaves no goroutine behind
// (goleak checks at the end of the package).
func TestStopBoundedByContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, _ := memory.NewDB().Election("e")
		fb := faulty.Wrap(b)
		f, _ := base.New(fb, "n1", base.Options{Timing: timing})
		if err := f.Start(ctx(t)); err != nil {
			t.Fatal(err)
		}
		for !f.IsLeader() {
			time.Sleep(time.Millisecond)
		}
		fb.Inject(faulty.Fault{Method: faulty.MethodHeartbeat, Hang: true})
		c, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if err := f.Stop(c); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Stop: %v, want DeadlineExceeded", err)
		}
		select {
		case <-f.Done():
		default:
			t.Fatal("Stop returned before its goroutines ended")
		}
	})
}

func TestProclaimPublishesValue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := cluster(t, memory.NewDB(), timing, 2)
		l := c.WaitLeader(t, wait)
		var f *basetest.Node
		for _, n := range c.Nodes {
			if n != l {
				f = n
			}
		}
		if err := f.Feed.Proclaim(ctx(t), []byte("x")); !errors.Is(err, base.ErrNotLeader) {
			t.Fatalf("Proclaim by a follower: %v, want ErrNotLeader", err)
		}
		if err := l.Feed.Proclaim(ctx(t), make([]byte, heartbeat.MaxValueLen+1)); !errors.Is(err, base.ErrInvalidConfig) {
			t.Fatalf("Proclaim of an oversized value: %v, want ErrInvalidConfig", err)
		}
		if err := l.Feed.Proclaim(ctx(t), []byte("10.0.0.7:8080")); err != nil {
			t.Fatal(err)
		}
		term, _ := l.Feed.Term()
		e, _ := f.WaitEvent(t, 0, wait, "new-leader with the proclaimed value", func(e base.Event) bool {
			return e.Type == base.EventNewLeader && string(e.Value) == "10.0.0.7:8080"
		})
		if e.Leader != l.ID || e.Term != term {
			t.Fatalf("the new value was announced for %s term %d, want %s term %d", e.Leader, e.Term, l.ID, term)
		}
		if rec, _ := f.Feed.Leader(); string(rec.Value) != "10.0.0.7:8080" {
			t.Fatalf("follower's Leader() has value %q after the announcement", rec.Value)
		}
	})
}

// A claim whose reply does not come within the lease it would grant must
// not make the node leader: it is bounded by the lease and given up.
func TestSlowClaimDoesNotLead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, _ := memory.NewDB().Election("e")
		fb := faulty.Wrap(b)
		fb.Inject(faulty.Fault{Method: faulty.MethodHeartbeat, Delay: timing.LeaseDuration + 10*time.Millisecond})
		f, _ := base.New(fb, "n1", base.Options{Timing: timing})
		events := f.Events()
		if err := f.Start(ctx(t)); err != nil {
			t.Fatal(err)
		}
		defer f.Stop(ctx(t))
		for e := range events {
			if e.Type == base.EventElected {
				t.Fatal("elected by a claim slower than the lease")
			}
			if e.Type == base.EventError && strings.Contains(e.Err.Error(), "claim") {
				break // the claim was given up; the test ends here
			}
		}
	})
}

// Events carry the record they report: a follower learns the leader's
// revision, store timestamp and lease from EventNewLeader, and a leader its
// claim's record from EventElected, without calling Feed.Leader.
func TestEventsCarryTheRecord(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := cluster(t, memory.NewDB(), timing, 2)
		l := c.WaitLeader(t, wait)
		term, _ := l.Feed.Term()
		el, _ := l.WaitEvent(t, 0, wait, "elected", func(e base.Event) bool { return e.Type == base.EventElected && e.Term == term })
		r := el.Record
		if r.Leader != l.ID || r.Term != term || r.Revision == 0 || r.Timestamp.IsZero() || r.Lease != timing.LeaseDuration || r.Election != c.Election {
			t.Fatalf("EventElected carries %+v, want the claim's record: leader %s, term %d, a revision, a timestamp, lease %v", r, l.ID, term, timing.LeaseDuration)
		}
		var f *basetest.Node
		for _, n := range c.Nodes {
			if n != l {
				f = n
			}
		}
		e, _ := f.WaitEvent(t, 0, wait, "new-leader of the leader's term", func(e base.Event) bool {
			return e.Type == base.EventNewLeader && e.Leader == l.ID && e.Term == term
		})
		r = e.Record
		if r.Leader != e.Leader || r.Term != e.Term || string(r.Value) != string(e.Value) || r.Revision == 0 || r.Timestamp.IsZero() || r.Lease != timing.LeaseDuration {
			t.Fatalf("EventNewLeader (%s term %d) carries %+v, want its record with revision, timestamp and lease", e.Leader, e.Term, r)
		}
	})
}
