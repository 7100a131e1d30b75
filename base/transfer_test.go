package base_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/base/basetest"
	"github.com/leaderfeed/leaderfeed/base/faulty"
	"github.com/leaderfeed/leaderfeed/memory"
)

// participants starts n participating nodes on one memory DB, node i
// with priority prio(i) (nil: all 0), under the unit tests' timing and a
// presence interval of 50 ms, TTL 150 ms, hysteresis 200 ms.
func participants(t *testing.T, n int, prio func(int) int) *basetest.Cluster {
	t.Helper()
	store := memory.NewDB()
	return basetest.NewClusterWith(t, func(e string) (backend.Election, error) { return store.Election(e) }, timing, n, 0, func(i int, o *base.Options) {
		o.Participate = true
		o.PresenceInterval, o.PresenceTTL, o.PriorityHysteresis = 50*time.Millisecond, 150*time.Millisecond, 200*time.Millisecond
		if prio != nil {
			o.Priority = prio(i)
		}
	})
}

func nextNode(c *basetest.Cluster, not *basetest.Node) *basetest.Node {
	return c.Nodes[(slices.Index(c.Nodes, not)+1)%len(c.Nodes)]
}

// A transfer moves leadership to the target at once on the fake clock: the
// vacancy and the target's claim take no time, no election timeout passes.
func TestTransferIsImmediate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := participants(t, 3, nil)
		l := c.WaitLeader(t, wait)
		to := nextNode(c, l)
		start := time.Now()
		if err := l.Feed.TransferTo(ctx(t), to.ID); err != nil {
			t.Fatalf("TransferTo: %v", err)
		}
		synctest.Wait()
		if got := c.WaitLeader(t, 0); got != to {
			t.Fatalf("%s leads after the transfer to %s", got.ID, to.ID)
		}
		if d := time.Since(start); d > timing.HeartbeatInterval {
			t.Fatalf("the transfer took %v on the fake clock, want no wait", d)
		}
		e, _ := to.WaitEvent(t, 0, wait, "elected", func(e base.Event) bool { return e.Type == base.EventElected })
		rec, _ := l.Feed.Leader()
		if rec.Leader != to.ID || rec.Term != e.Term {
			t.Fatalf("the old leader sees %v, want %s in term %d", rec, to.ID, e.Term)
		}
	})
}

// A vacancy reserved for a dead node is claimed by another node only after
// its election timeout: no earlier (the target keeps its priority), no
// later than a crash would cost.
func TestTransferToDeadNode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := participants(t, 3, nil)
		l := c.WaitLeader(t, wait)
		to := nextNode(c, l)
		to.Faulty.Partition()
		start := time.Now()
		if err := l.Feed.TransferTo(ctx(t), to.ID); err != nil {
			t.Fatalf("TransferTo: %v", err)
		}
		time.Sleep(timing.ElectionTimeoutMin - time.Millisecond)
		synctest.Wait()
		if ls := c.Leaders(); len(ls) != 0 {
			t.Fatalf("%s leads %v after the transfer to the dead %s, before any election timeout", ls[0].ID, time.Since(start), to.ID)
		}
		l2 := c.WaitLeader(t, timing.ElectionTimeoutMax+timing.HeartbeatInterval)
		if l2 == to {
			t.Fatal("the partitioned target leads")
		}
		if d := time.Since(start); d > timing.ElectionTimeoutMax+timing.HeartbeatInterval {
			t.Fatalf("a node leads %v after the transfer, longer than a crash costs", d)
		}
		to.Faulty.Heal()
	})
}

// The reserved vacancy commits but its reply is lost: the leader writes it
// again, finds its own vacancy (or the target's claim) and reports the
// transfer done; the target leads.
func TestTransferVacancyReplyLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := participants(t, 3, nil)
		l := c.WaitLeader(t, wait)
		to := nextNode(c, l)
		// The target's refreshes fail: its token grows older than a
		// handover in one write may use (three quarters of the lease),
		// while it stays live (TTL): the transfer reserves the vacancy.
		to.Faulty.Inject(faulty.Fault{Method: faulty.MethodPresent})
		time.Sleep(60 * time.Millisecond)
		synctest.Wait() // no renewal in flight: the next write is the vacancy
		// Guarded: the leader's view holds the target.
		l.Faulty.Inject(faulty.Fault{Method: faulty.MethodHeartbeatGuarded, Nth: 1, After: true})
		if err := l.Feed.TransferTo(ctx(t), to.ID); err != nil {
			t.Fatalf("TransferTo with the vacancy's reply lost: %v", err)
		}
		synctest.Wait()
		if got := c.WaitLeader(t, timing.HeartbeatInterval); got != to {
			t.Fatalf("%s leads, want the target %s", got.ID, to.ID)
		}
		reserved := 0
		for _, w := range l.Faulty.Writes() {
			if w.Next.Successor == to.ID {
				reserved++
			}
		}
		if reserved != 2 {
			t.Fatalf("%d writes of the reserved vacancy, want 2: the lost one and the one that found it stored", reserved)
		}
	})
}

// Bad transfers leave the leader leading in the same term, each with its
// own error.
func TestTransferRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := participants(t, 2, nil)
		l := c.WaitLeader(t, wait)
		f := nextNode(c, l)
		_, term, _ := l.Feed.LeaderContext()
		for _, tc := range []struct {
			n    *basetest.Node
			to   string
			want error
		}{
			{l, l.ID, base.ErrTransferToSelf},
			{l, "stranger", base.ErrUnknownParticipant},
			{l, "bad\nid", base.ErrInvalidConfig},
			{f, l.ID, base.ErrNotLeader},
		} {
			if err := tc.n.Feed.TransferTo(ctx(t), tc.to); !errors.Is(err, tc.want) {
				t.Errorf("TransferTo(%q) by %s: %v, want %v", tc.to, tc.n.ID, err, tc.want)
			}
		}
		if _, t2, ok := l.Feed.LeaderContext(); !ok || t2 != term {
			t.Fatalf("leading %v in term %d after refused transfers, want term %d", ok, t2, term)
		}
	})
}

// Priority: the leader hands over to the participant of higher priority
// once it has seen it at every check for the hysteresis, not before; the
// new leader, of the highest priority, keeps leading.
func TestPriorityHandoverAfterHysteresis(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := participants(t, 2, func(i int) int { return i * 10 }) // node-1 preferred
		l := c.WaitLeader(t, wait)
		from := 0
		if l == c.Nodes[1] {
			// The preferred node won the first election: hand leadership
			// to node-0 by hand; node-0 must give it back after the
			// hysteresis, as if it had won first.
			synctest.Wait()
			from = len(c.Nodes[0].Events())
			if err := l.Feed.TransferTo(ctx(t), c.Nodes[0].ID); err != nil {
				t.Fatalf("TransferTo node-0: %v", err)
			}
			l = c.Nodes[0]
		}
		elected, at := l.WaitEvent(t, from, wait, "elected", func(e base.Event) bool { return e.Type == base.EventElected })
		e, _ := l.WaitEvent(t, at, time.Second, "unelected", func(e base.Event) bool { return e.Type == base.EventUnelected })
		if e.Reason != base.ReasonTransferred {
			t.Fatalf("unelected: %v, want transferred", e.Reason)
		}
		// Checks every 50 ms: the first sees node-1, the one 200 ms later
		// hands over.
		if d := e.At.Sub(elected.At); d < 200*time.Millisecond || d > 300*time.Millisecond {
			t.Fatalf("handed over %v after it was elected, want after the hysteresis (200 ms) plus at most two checks", d)
		}
		synctest.Wait()
		if got := c.WaitLeader(t, 0); got != c.Nodes[1] {
			t.Fatalf("%s leads, want the preferred node-1", got.ID)
		}
		time.Sleep(time.Second)
		if got := c.WaitLeader(t, 0); got != c.Nodes[1] {
			t.Fatalf("%s leads a second later, want node-1 to keep leading", got.ID)
		}
	})
}

// TransferTo on a Feed that does not run fails as Resign does.
func TestTransferLifecycle(t *testing.T) {
	store := memory.NewDB()
	b, _ := store.Election("e")
	f, _ := base.New(b, "n", base.Options{Timing: timing})
	if err := f.TransferTo(ctx(t), "m"); !errors.Is(err, base.ErrNotStarted) {
		t.Fatalf("TransferTo before Start: %v, want ErrNotStarted", err)
	}
	if err := f.Stop(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if err := f.TransferTo(ctx(t), "m"); !errors.Is(err, base.ErrClosed) {
		t.Fatalf("TransferTo after Stop: %v, want ErrClosed", err)
	}
}

// A node that participates on a backend without the presence capability
// fails Start with ErrUnsupported; a Feed that does not participate writes
// no presence record.
func TestParticipateNeedsPresence(t *testing.T) {
	store := memory.NewDB()
	b, _ := store.Election("e")
	f, err := base.New(plain{b}, "n", base.Options{Timing: timing, Participate: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Start(ctx(t)); !errors.Is(err, backend.ErrUnsupported) {
		t.Fatalf("Start: %v, want ErrUnsupported", err)
	}
	if err := f.Stop(ctx(t)); err != nil {
		t.Fatal(err)
	}
	b2, _ := store.Election("e")
	g, _ := base.New(b2, "quiet", base.Options{Timing: timing})
	if err := g.Start(ctx(t)); err != nil {
		t.Fatal(err)
	}
	defer g.Stop(context.Background())
	ps, err := g.Participants(ctx(t))
	if err != nil || len(ps) != 0 {
		t.Fatalf("Participants = %v, %v; want none: a node that does not participate writes nothing", ps, err)
	}
}

// plain hides the presence capability of a Backend.
type plain struct{ backend.Election }

// Start's first presence write is bounded by Start's context, not by a
// refresh's timeout (PresenceInterval): a store slow to answer it (a
// pool's first connection on a loaded machine) does not fail Start.
func TestStartPresenceSlowerThanInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, _ := memory.NewDB().Election("e")
		fb := faulty.Wrap(b)
		const interval = 60 * time.Millisecond
		fb.Inject(faulty.Fault{Method: faulty.MethodPresent, Nth: 1, Delay: 3 * interval})
		f, err := base.New(fb, "n", base.Options{Timing: timing, Participate: true, PresenceInterval: interval})
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Start(context.Background()); err != nil {
			t.Fatalf("Start with a first presence write of %v (interval %v): %v", 3*interval, interval, err)
		}
		if err := f.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

// Stop deletes the presence record only after a presence write in flight
// has ended: one that committed after the delete would list the stopped
// node as a live participant, a successor for a handover, until it
// expired.
func TestStopWaitsForPresenceInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		db := memory.NewDB()
		b, _ := db.Election("e")
		fb := faulty.Wrap(b)
		const interval = 50 * time.Millisecond
		f, err := base.New(fb, "n", base.Options{Timing: timing, Participate: true, PresenceInterval: interval})
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		// A refresh held back, that commits even once Stop gave up on it.
		fb.Inject(faulty.Fault{Method: faulty.MethodPresent, Delay: 30 * time.Millisecond, Late: true})
		calls := fb.Calls(faulty.MethodPresent)
		time.Sleep(interval + time.Millisecond) // a refresh is held back now
		synctest.Wait()
		if fb.Calls(faulty.MethodPresent) == calls {
			t.Fatal("no presence refresh in flight")
		}
		if err := f.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		other, _ := db.Election("e")
		ps, _, err := other.(backend.PresenceElection).Participants(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ps {
			if p.Node == "n" {
				t.Fatalf("the stopped node's presence record is in the store: %+v", p)
			}
		}
	})
}
