package basetest

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/base/faulty"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// memoryCluster starts a Cluster of n campaigners on a fresh memory DB
// and waits for its first leader.
func memoryCluster(t *testing.T, n int) (*Cluster, *Node) {
	t.Helper()
	store := memory.NewDB()
	c := NewCluster(t, func(e string) (backend.Election, error) { return store.Election(e) }, FastTiming, n, 0)
	return c, c.WaitLeader(t, 2*FastTiming.ElectionTimeoutMax)
}

// crash partitions l, the leader, and makes every other node's Heartbeat
// calls meet fault ft.
func crash(c *Cluster, l *Node, ft faulty.Fault) {
	for _, n := range c.Nodes {
		if n != l {
			n.Faulty.Inject(ft)
		}
	}
	l.Faulty.Partition()
}

// claimsTimedOut decides whether the rule "A transfer to a node that died
// meanwhile costs no more than a crash" retries or fails when no node
// leads in time: it must count the claims the store did not answer, as
// the engine reports them, and nothing else.
func TestClaimsTimedOut(t *testing.T) {
	// The rule's bound (ElectionTimeoutMax and a heartbeat) with the
	// claim's deadline (the lease) for its margin: by then every follower
	// has claimed and its claim has run out of time.
	bound := FastTiming.ElectionTimeoutMax + FastTiming.HeartbeatInterval + FastTiming.LeaseDuration

	t.Run("claims the store never answers are counted", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c, l := memoryCluster(t, 3)
			crash(c, l, faulty.Fault{Method: faulty.MethodHeartbeat, Hang: true})
			if l2 := c.tryWaitLeader(t, bound, l); l2 != nil {
				t.Fatalf("%s leads although every claim hangs", l2.ID)
			}
			if n := c.claimsTimedOut(l); n == 0 {
				t.Fatalf("no claim counted as timed out within %v of the crash", bound)
			}
		})
	})

	t.Run("claims the store refuses are not counted", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c, l := memoryCluster(t, 3)
			refused := errors.New("claim refused")
			crash(c, l, faulty.Fault{Method: faulty.MethodHeartbeat, Err: refused})
			for _, n := range c.Nodes {
				if n != l {
					n.WaitEvent(t, 0, bound, "a refused claim", func(e base.Event) bool {
						return e.Type == base.EventError && errors.Is(e.Err, refused)
					})
				}
			}
			if n := c.claimsTimedOut(); n != 0 {
				t.Fatalf("%d claims counted as timed out; every claim was refused at once", n)
			}
		})
	})

	t.Run("a healthy election counts none", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c, _ := memoryCluster(t, 3)
			time.Sleep(10 * FastTiming.HeartbeatInterval)
			if n := c.claimsTimedOut(); n != 0 {
				t.Fatalf("%d claims counted as timed out in a healthy election", n)
			}
		})
	})
}

// Terms that begin at one instant (a fake clock's) are judged in the
// store's order, by term, whatever order the events came in; one term
// twice is still a violation.
func TestCheckerSameInstant(t *testing.T) {
	at := time.Unix(1000, 0)
	rec := func(term uint64) heartbeat.Record {
		return heartbeat.Record{Election: "e", Leader: "x", Term: term, Revision: term}
	}
	for _, tc := range []struct {
		terms [2]uint64
		ok    bool
	}{{[2]uint64{3, 2}, true}, {[2]uint64{2, 3}, true}, {[2]uint64{2, 2}, false}} {
		for range 20 { // sort.Slice's order of equal starts varies
			c := NewChecker()
			for i, term := range tc.terms {
				node := []string{"a", "b"}[i]
				c.Observe(node, base.Event{Type: base.EventElected, At: at, Term: term, Record: rec(term)})
				c.Observe(node, base.Event{Type: base.EventUnelected, At: at, Term: term})
			}
			if err := c.Check(); (err == nil) != tc.ok {
				t.Fatalf("terms %v at one instant: %v, want ok %v", tc.terms, err, tc.ok)
			}
		}
	}
}
