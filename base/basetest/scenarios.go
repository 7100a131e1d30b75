package basetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/base/faulty"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// Node is one Feed of a Cluster, on a Faulty-wrapped backend, with the
// events it reported.
type Node struct {
	// ID is the node id the Feed was created with.
	ID string
	// Feed is the node's Feed.
	Feed *base.Feed
	// Faulty wraps the node's backend, to inject faults into it.
	Faulty *faulty.Backend

	// name tells the node from the others of its Cluster, in the Checker
	// and in messages: its ID, unless another node shares that ID.
	name string

	mu     sync.Mutex
	events []base.Event
	wake   chan struct{}
	done   chan struct{}
}

// Events returns a copy of the events the node reported so far.
func (n *Node) Events() []base.Event {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]base.Event(nil), n.events...)
}

// WaitEvent waits up to d for an event that pass accepts, looking at the
// events from index from on, and returns it with its index.
func (n *Node) WaitEvent(t testing.TB, from int, d time.Duration, what string, pass func(base.Event) bool) (base.Event, int) {
	t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		n.mu.Lock()
		for i := from; i < len(n.events); i++ {
			if pass(n.events[i]) {
				e := n.events[i]
				n.mu.Unlock()
				return e, i
			}
		}
		from = len(n.events)
		n.mu.Unlock()
		select {
		case <-n.wake:
		case <-n.done:
			t.Fatalf("%s: events ended while waiting for %s", n.name, what)
		case <-deadline.C:
			t.Fatalf("%s: no %s within %v", n.name, what, d)
		}
	}
}

// Cluster is several nodes of one election, all watched by one Checker.
type Cluster struct {
	// Election is the name of the election the nodes run.
	Election string
	// Timing is the timing every node uses.
	Timing heartbeat.Timing
	// Checker has seen every node's leadership events.
	Checker *Checker
	// Nodes are the nodes: campaigners first, then observers.
	Nodes []*Node
}

// NewCluster starts n nodes of a fresh election on backends from open, with
// the timing t (zero fields: FastTiming's). observers of them are
// observe-only. At cleanup it stops every node and fails the test if the
// Checker found a violation.
func NewCluster(t testing.TB, open func(election string) (backend.Election, error), tm heartbeat.Timing, n, observers int) *Cluster {
	t.Helper()
	return NewClusterWith(t, open, tm, n, observers, nil)
}

// NewClusterWith is NewCluster with per-node options: opts, when not nil,
// is called for node i (campaigners first, then observers) with the
// options NewCluster would use, and may change them (Participate,
// Priority, ...).
func NewClusterWith(t testing.TB, open func(election string) (backend.Election, error), tm heartbeat.Timing, n, observers int, opts func(i int, o *base.Options)) *Cluster {
	t.Helper()
	ids := make([]string, n+observers)
	for i := range ids {
		ids[i] = fmt.Sprintf("node-%d", i)
		if i >= n {
			ids[i] = fmt.Sprintf("observer-%d", i-n)
		}
	}
	return newCluster(t, open, tm, ids, n, opts)
}

// newCluster is NewClusterWith with the node ids given: ids[i] is node
// i's, the first n campaign, the others observe. Nodes that share an id
// (two processes using one node id) are named apart in the Checker: the
// id and the process, "node-0 (process 2)".
func newCluster(t testing.TB, open func(election string) (backend.Election, error), tm heartbeat.Timing, ids []string, n int, opts func(i int, o *base.Options)) *Cluster {
	t.Helper()
	tm = fillTiming(tm)
	c := &Cluster{Election: Election(), Timing: tm, Checker: NewChecker()}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		for _, node := range c.Nodes {
			if err := node.Feed.Stop(ctx); err != nil {
				t.Errorf("%s: Stop: %v", node.name, err)
			}
		}
		for _, node := range c.Nodes {
			<-node.done
		}
		if err := c.Checker.Check(); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			c.logEvents(t)
		}
	})
	seen := make(map[string]int)
	for _, id := range ids {
		seen[id]++
	}
	process := make(map[string]int)
	for i, id := range ids {
		b, err := open(c.Election)
		if err != nil {
			t.Fatalf("open backend: %v", err)
		}
		f := faulty.Wrap(b)
		node := &Node{ID: id, Faulty: f, name: id, wake: make(chan struct{}, 1), done: make(chan struct{})}
		if seen[id] > 1 {
			process[id]++
			node.name = fmt.Sprintf("%s (process %d)", id, process[id])
		}
		o := base.Options{Timing: tm, ObserveOnly: i >= n, Value: []byte("value of " + node.name)}
		if opts != nil {
			opts(i, &o)
		}
		feed, err := base.New(f, node.ID, o)
		if err != nil {
			_ = b.Close()
			t.Fatalf("base.New: %v", err)
		}
		node.Feed = feed
		sub := feed.Subscribe(context.Background())
		go func() {
			defer close(node.done)
			for e := range sub.C {
				c.Checker.Observe(node.name, e)
				node.mu.Lock()
				node.events = append(node.events, e)
				node.mu.Unlock()
				select {
				case node.wake <- struct{}{}:
				default:
				}
			}
		}()
		c.Nodes = append(c.Nodes, node)
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	for _, node := range c.Nodes {
		if err := node.Feed.Start(ctx); err != nil {
			t.Fatalf("%s: Start: %v", node.name, err)
		}
	}
	return c
}

func fillTiming(tm heartbeat.Timing) heartbeat.Timing {
	if tm.HeartbeatInterval == 0 {
		tm.HeartbeatInterval = FastTiming.HeartbeatInterval
	}
	if tm.ElectionTimeoutMin == 0 {
		tm.ElectionTimeoutMin = FastTiming.ElectionTimeoutMin
	}
	if tm.ElectionTimeoutMax == 0 {
		tm.ElectionTimeoutMax = FastTiming.ElectionTimeoutMax
	}
	if tm.LeaseDuration == 0 {
		tm.LeaseDuration = FastTiming.LeaseDuration
	}
	return tm
}

// logEvents logs every node's events, for the diagnosis of a failure.
func (c *Cluster) logEvents(t testing.TB) {
	t.Helper()
	var start time.Time
	for _, n := range c.Nodes {
		if ev := n.Events(); len(ev) > 0 && (start.IsZero() || ev[0].At.Before(start)) {
			start = ev[0].At
		}
	}
	for _, n := range c.Nodes {
		for _, e := range n.Events() {
			t.Logf("%9.3fms %s %v", float64(e.At.Sub(start).Microseconds())/1000, n.name, e)
		}
	}
}

// WaitSubscribed waits until every node has reported EventSubscribeStarted
// at least once. Feeds open in the background, so a fault meant for an open
// feed must wait for this.
func (c *Cluster) WaitSubscribed(t testing.TB) {
	t.Helper()
	for _, n := range c.Nodes {
		n.WaitEvent(t, 0, callTimeout, "subscribe-started", func(e base.Event) bool { return e.Type == base.EventSubscribeStarted })
	}
}

// Leaders returns the nodes that count themselves leader now.
func (c *Cluster) Leaders() []*Node {
	var out []*Node
	for _, n := range c.Nodes {
		if n.Feed.IsLeader() {
			out = append(out, n)
		}
	}
	return out
}

// WaitLeader waits up to d for exactly one node other than the excluded to
// lead, and returns it. It polls every millisecond.
func (c *Cluster) WaitLeader(t testing.TB, d time.Duration, exclude ...*Node) *Node {
	t.Helper()
	l := c.tryWaitLeader(t, d, exclude...)
	if l == nil {
		t.Fatalf("no new leader within %v (leaders now: %v)", d, ids(c.Leaders()))
	}
	return l
}

// tryWaitLeader is WaitLeader that returns nil when no node leads in time.
func (c *Cluster) tryWaitLeader(t testing.TB, d time.Duration, exclude ...*Node) *Node {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ls := c.Leaders()
		if len(ls) > 1 {
			t.Fatalf("%d nodes count themselves leader at once: %v", len(ls), ids(ls))
		}
		if len(ls) == 1 && !contains(exclude, ls[0]) {
			return ls[0]
		}
		if time.Now().After(deadline) {
			return nil
		}
		time.Sleep(time.Millisecond)
	}
}

// waitLeaderOrStall is WaitLeader that returns nil, and logs why, when no
// node leads in time because claims ran out of time in the store (see
// claimsTimedOut): the caller's rule then runs again on a fresh cluster.
// Without such claims it fails t.
func (c *Cluster) waitLeaderOrStall(t testing.TB, d time.Duration, exclude ...*Node) *Node {
	t.Helper()
	if l := c.tryWaitLeader(t, d, exclude...); l != nil {
		return l
	}
	if n := c.claimsTimedOut(exclude...); n > 0 {
		t.Logf("no new leader within %v: %d claims ran out of time in the store (a loaded machine)", d, n)
		return nil
	}
	t.Fatalf("no new leader within %v (leaders now: %v)", d, ids(c.Leaders()))
	return nil
}

// claimsTimedOut returns how many claims of the nodes other than the
// excluded ran out of time in the store (EventError of a claim that
// matches context.DeadlineExceeded): a store that does not answer, as on
// a loaded machine, promises no new leader.
func (c *Cluster) claimsTimedOut(exclude ...*Node) int {
	n := 0
	for _, node := range c.Nodes {
		if contains(exclude, node) {
			continue
		}
		for _, e := range node.Events() {
			if e.Type == base.EventError && errors.Is(e.Err, context.DeadlineExceeded) && strings.Contains(e.Err.Error(), "claim term") {
				n++
			}
		}
	}
	return n
}

func ids(ns []*Node) []string {
	var out []string
	for _, n := range ns {
		out = append(out, n.name)
	}
	return out
}

func contains(ns []*Node, n *Node) bool {
	for _, m := range ns {
		if m == n {
			return true
		}
	}
	return false
}

// DelayRenewal holds n's next renewal (its next Heartbeat call) back for
// longer than the lease, so that its lease runs out as it does when a
// loaded machine or a slow store delays a renewal. Rules that run under
// load run once so, to show that they allow what the guarantee allows.
func (c *Cluster) DelayRenewal(n *Node) {
	n.Faulty.Inject(faulty.Fault{Method: faulty.MethodHeartbeat, Nth: 1, Delay: c.Timing.LeaseDuration + c.Timing.HeartbeatInterval})
}

// WaitLeaseEnd waits until n's leadership of the term it holds (or held
// last) ends by its lease (after DelayRenewal).
func (c *Cluster) WaitLeaseEnd(t testing.TB, n *Node) {
	t.Helper()
	term, _ := n.Feed.Term()
	e := n.WaitUnelected(t, term, c.Timing.LeaseDuration+feedWait, "unelected by the delayed renewal")
	if e.Reason != base.ReasonLeaseExpired && e.Reason != base.ReasonDeposed {
		t.Fatalf("%s: %v after its renewal was delayed past the lease, want lease-expired", n.ID, e)
	}
}

// WaitUnelected waits up to d for the end of n's leadership of term and
// returns its EventUnelected. A rule looks at the end of the term it is
// about, not at n's first end: on a loaded machine an earlier term of n
// may have ended by a lease that ran out (lease-expired, or deposed when
// another node's claim came first), which the guarantee allows. An
// earlier term that ended otherwise (resigned, stopped, transferred: only
// a call does that, and the rules make none before the one they check)
// fails t.
func (n *Node) WaitUnelected(t testing.TB, term uint64, d time.Duration, what string) base.Event {
	t.Helper()
	e, i := n.WaitEvent(t, 0, d, what, func(e base.Event) bool { return e.Type == base.EventUnelected && e.Term == term })
	for _, p := range n.Events()[:i] {
		switch {
		case p.Type != base.EventUnelected:
		case p.Reason != base.ReasonLeaseExpired && p.Reason != base.ReasonDeposed:
			t.Fatalf("%s: %v before term %d ended, and no call ended it", n.ID, p, term)
		default:
			t.Logf("%s: %v before term %d (a lease that ran out: allowed on a loaded machine)", n.ID, p, term)
		}
	}
	return e
}

// LeaseRanOut reports whether err, the error of a call that needs n to
// lead (Resign, TransferTo), is ErrNotLeader because n's lease ran out
// before it (a loaded machine). A leadership that ended otherwise fails t.
func (c *Cluster) LeaseRanOut(t testing.TB, n *Node, err error) bool {
	t.Helper()
	if !errors.Is(err, base.ErrNotLeader) {
		return false
	}
	n.WaitEvent(t, 0, feedWait, "unelected", func(e base.Event) bool { return e.Type == base.EventUnelected })
	// Every end so far, not only the first: a lease may run out more than
	// once on a loaded machine, and the last end is the one the call met.
	for _, e := range n.Events() {
		if e.Type == base.EventUnelected && e.Reason != base.ReasonLeaseExpired && e.Reason != base.ReasonDeposed {
			t.Fatalf("%s: %v before the call, and no call ended its leadership", n.ID, e)
		}
	}
	return true
}

// RequireLeaseEndsOnly fails t for every leadership that ended for another
// reason than a lease that ran out, and returns how many did end so.
// A lease runs out on a loaded machine (the renewal or its timer comes
// late): the event says lease-expired, or deposed when another node's
// claim came first; a node claims only after it saw no renewal for
// ElectionTimeoutMin, longer than the lease, so a deposed leader that made
// no call of its own had let its lease run out. Resigned, stopped and
// transferred never happen without a call, so they are never allowed here.
func (c *Cluster) RequireLeaseEndsOnly(t testing.TB) int {
	t.Helper()
	ends := 0
	for _, n := range c.Nodes {
		for _, e := range n.Events() {
			if e.Type != base.EventUnelected {
				continue
			}
			if e.Reason != base.ReasonLeaseExpired && e.Reason != base.ReasonDeposed {
				t.Errorf("%s: %v without a call that ends leadership: only a lease that runs out may end it here", n.ID, e)
				continue
			}
			ends++
		}
	}
	if ends > 0 {
		t.Logf("%d leadership(s) ended by a lease that ran out (a loaded machine, or the delayed renewal)", ends)
	}
	return ends
}

// WaitRenewals waits until a leader has renewed k times in one term and
// returns it. A lease that runs out meanwhile starts the count again with
// the next leader: liveness, not stability, is what it checks.
func (c *Cluster) WaitRenewals(t testing.TB, k uint64) *Node {
	t.Helper()
	deadline := time.Now().Add(feedWait)
	l := c.WaitLeader(t, c.Timing.ElectionTimeoutMax+c.Timing.HeartbeatInterval+margin)
	rec, _ := l.Feed.Leader()
	for {
		now, ok := l.Feed.Leader()
		switch {
		case !l.Feed.IsLeader() || !ok || now.Term != rec.Term:
			l = c.WaitLeader(t, c.Timing.ElectionTimeoutMax+c.Timing.HeartbeatInterval+margin)
			rec, _ = l.Feed.Leader()
		case now.Revision >= rec.Revision+k:
			return l
		}
		if time.Now().After(deadline) {
			t.Fatalf("no leader renewed %d times in one term within %v (%s at revision %d, from %d)", k, feedWait, l.ID, now.Revision, rec.Revision)
		}
		time.Sleep(time.Millisecond)
	}
}

// margin is added to time bounds for scheduling on a loaded machine.
var margin = Scaled(700 * time.Millisecond)

func (s *suite) cluster(t *testing.T, n, observers int) *Cluster {
	t.Helper()
	return NewCluster(t, func(e string) (backend.Election, error) { return s.h.Open(t, e) }, s.h.Timing, n, observers)
}

func (s *suite) feeds(t *testing.T) {
	ruleUnderLoad(t, "Exactly one of three nodes leads within the election timeout and keeps leading while it renews; leadership moves only when a lease runs out", func(t *testing.T, late bool) {
		c := s.cluster(t, 3, 0)
		l := c.WaitLeader(t, c.Timing.ElectionTimeoutMax+margin)
		if late {
			c.DelayRenewal(l)
			c.WaitLeaseEnd(t, l)
		}
		time.Sleep(10 * c.Timing.HeartbeatInterval)
		l = c.WaitRenewals(t, 3)
		c.RequireLeaseEndsOnly(t)
		for _, n := range c.Nodes {
			n.WaitEvent(t, 0, feedWait, "new-leader "+l.ID, func(e base.Event) bool { return e.Type == base.EventNewLeader && e.Leader == l.ID })
			if rec, ok := n.Feed.Leader(); !ok || rec.Leader != l.ID {
				t.Errorf("%s sees leader %q, want %s", n.ID, rec.Leader, l.ID)
			}
		}
	})

	ruleRetried(t, "Resign hands leadership to another node at once, without waiting for an election timeout", func(t *testing.T) bool {
		c := s.cluster(t, 3, 0)
		l := c.WaitLeader(t, c.Timing.ElectionTimeoutMax+margin)
		term, _ := l.Feed.Term()
		start := time.Now()
		if err := l.Feed.Resign(ctxFor(t)); err != nil {
			if c.LeaseRanOut(t, l, err) {
				return false
			}
			t.Fatalf("Resign: %v", err)
		}
		if l.Feed.IsLeader() {
			t.Fatal("the node still counts itself leader after Resign returned")
		}
		l2 := c.WaitLeader(t, c.Timing.ElectionTimeoutMin, l)
		t.Logf("handover took %v", time.Since(start))
		term2, _ := l2.Feed.Term()
		if term2 <= term {
			t.Fatalf("new term %d is not greater than the resigned term %d", term2, term)
		}
		e := l.WaitUnelected(t, term, feedWait, "unelected(resigned)")
		if e.Reason != base.ReasonResigned {
			t.Fatalf("unelected with reason %v, want resigned", e.Reason)
		}
		if err := l.Feed.Resign(ctxFor(t)); !errors.Is(err, base.ErrNotLeader) {
			t.Fatalf("Resign by a follower: %v, want ErrNotLeader", err)
		}
		return true
	})

	rule(t, "A leader cut off from the store (a crash) loses its lease, and another node leads within the election timeout plus a margin", func(t *testing.T) {
		c := s.cluster(t, 3, 0)
		l := c.WaitLeader(t, c.Timing.ElectionTimeoutMax+margin)
		ctx, term, _ := l.Feed.LeaderContext()
		start := time.Now()
		l.Faulty.Partition()
		select {
		case <-ctx.Done():
		case <-time.After(c.Timing.LeaseDuration + margin):
			t.Fatal("the leader context was not cancelled when the lease ran out")
		}
		e := l.WaitUnelected(t, term, feedWait, "unelected")
		if e.Reason != base.ReasonLeaseExpired {
			t.Fatalf("unelected with reason %v, want lease-expired", e.Reason)
		}
		l2 := c.WaitLeader(t, c.Timing.ElectionTimeoutMax+c.Timing.HeartbeatInterval+margin, l)
		t.Logf("failover took %v (election timeout %v..%v)", time.Since(start), c.Timing.ElectionTimeoutMin, c.Timing.ElectionTimeoutMax)
		l.Faulty.Heal()
		// The old leader comes back as a follower of the new one.
		l.WaitEvent(t, 0, feedWait, "the new leader announced after healing", func(e base.Event) bool {
			return e.Type == base.EventNewLeader && e.Leader == l2.ID
		})
		if l.Feed.IsLeader() {
			t.Fatal("the healed old leader counts itself leader")
		}
	})

	ruleRetried(t, "A broken feed is reported, reopened with backoff, and the election goes on", func(t *testing.T) bool {
		c := s.cluster(t, 3, 0)
		l := c.WaitLeader(t, c.Timing.ElectionTimeoutMax+margin)
		c.WaitSubscribed(t)
		marks := make([]int, len(c.Nodes))
		for i, n := range c.Nodes {
			marks[i] = len(n.Events())
			n.Faulty.BreakFeed(nil)
		}
		for i, n := range c.Nodes {
			_, at := n.WaitEvent(t, marks[i], feedWait, "subscribe-error", func(e base.Event) bool {
				return e.Type == base.EventSubscribeError && errors.Is(e.Err, faulty.ErrInjected)
			})
			n.WaitEvent(t, at, feedWait, "subscribe-started after the error", func(e base.Event) bool { return e.Type == base.EventSubscribeStarted })
		}
		if err := l.Feed.Resign(ctxFor(t)); err != nil {
			if c.LeaseRanOut(t, l, err) {
				return false
			}
			t.Fatalf("Resign: %v", err)
		}
		c.WaitLeader(t, c.Timing.ElectionTimeoutMin, l)
		return true
	})

	ruleRetried(t, "A node whose feed cannot be opened polls the record and is never deaf", func(t *testing.T) bool {
		c := s.cluster(t, 2, 0)
		l := c.WaitLeader(t, c.Timing.ElectionTimeoutMax+margin)
		var f *Node
		for _, n := range c.Nodes {
			if n != l {
				f = n
			}
		}
		c.WaitSubscribed(t)
		f.Faulty.Inject(faulty.Fault{Method: faulty.MethodSubscribe, Err: errors.New("feed refused")})
		mark := len(f.Events())
		getsAtBreak := f.Faulty.Calls(faulty.MethodGet)
		f.Faulty.BreakFeed(nil)
		f.WaitEvent(t, mark, feedWait, "subscribe-error", func(e base.Event) bool { return e.Type == base.EventSubscribeError })
		// A node reads the record once when its feed fails. Wait for that
		// read, so that the handover below can only be learned by polling.
		deadline := time.Now().Add(feedWait)
		for f.Faulty.Calls(faulty.MethodGet) == getsAtBreak {
			if time.Now().After(deadline) {
				t.Fatalf("the follower did not read the record within %v of its feed failing", feedWait)
			}
			time.Sleep(time.Millisecond)
		}
		writesAtResign := len(f.Faulty.Writes())
		// With its feed down the follower must still learn of the handover.
		if err := l.Feed.Resign(ctxFor(t)); err != nil {
			if c.LeaseRanOut(t, l, err) {
				return false
			}
			t.Fatalf("Resign: %v", err)
		}
		c.WaitLeader(t, c.Timing.ElectionTimeoutMax+margin, l)
		// A follower that polls reads the vacancy (by a read in flight at
		// the handover or a later one) and claims it: its first write
		// expects the vacant record. A deaf one claims the old record after
		// its election timeout, is refused, and learns of the vacancy only
		// from that conflict.
		writes := f.Faulty.Writes()[writesAtResign:]
		if len(writes) == 0 {
			t.Fatal("the follower leads without having written")
		}
		if first := writes[0].Expected; first.Leader != "" || first.Revision == 0 {
			t.Fatalf("the follower's first write after the handover expected %v, want the vacant record it polled (it claimed the old record: deaf)", first)
		}
		return true
	})

	rule(t, "Stop of the leader hands over at once, and Stop is idempotent", func(t *testing.T) {
		c := s.cluster(t, 3, 0)
		l := c.WaitLeader(t, c.Timing.ElectionTimeoutMax+margin)
		ctx, _, _ := l.Feed.LeaderContext()
		if err := l.Feed.Stop(ctxFor(t)); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		if ctx.Err() == nil {
			t.Fatal("the leader context is live after Stop")
		}
		c.WaitLeader(t, c.Timing.ElectionTimeoutMin, l)
		if err := l.Feed.Stop(ctxFor(t)); err != nil {
			t.Fatalf("second Stop: %v", err)
		}
		if err := l.Feed.Start(ctxFor(t)); !errors.Is(err, base.ErrClosed) {
			t.Fatalf("Start after Stop: %v, want ErrClosed", err)
		}
	})

	ruleRetried(t, "Observe-only nodes follow the leader and never lead", func(t *testing.T) bool {
		c := s.cluster(t, 2, 1)
		l := c.WaitLeader(t, c.Timing.ElectionTimeoutMax+margin)
		obs := c.Nodes[2]
		obs.WaitEvent(t, 0, feedWait, "new-leader "+l.ID, func(e base.Event) bool { return e.Type == base.EventNewLeader && e.Leader == l.ID })
		if err := obs.Feed.Resign(ctxFor(t)); !errors.Is(err, base.ErrObserveOnly) {
			t.Fatalf("Resign of an observer: %v, want ErrObserveOnly", err)
		}
		if err := l.Feed.Resign(ctxFor(t)); err != nil {
			if c.LeaseRanOut(t, l, err) {
				return false
			}
			t.Fatalf("Resign: %v", err)
		}
		l2 := c.WaitLeader(t, c.Timing.ElectionTimeoutMax+margin, l)
		if l2 == obs {
			t.Fatal("the observer became leader")
		}
		e, _ := obs.WaitEvent(t, 0, feedWait, "new-leader "+l2.ID, func(e base.Event) bool { return e.Type == base.EventNewLeader && e.Leader == l2.ID })
		if string(e.Value) != "value of "+l2.ID {
			t.Fatalf("observer saw value %q, want the leader's value", e.Value)
		}
		return true
	})

	rule(t, "A malformed election record is reported as ignored and crashes no node", func(t *testing.T) {
		if s.h.WriteMalformed == nil {
			t.Skip("harness has no WriteMalformed")
		}
		e := Election()
		if err := s.h.WriteMalformed(ctxFor(t), e); err != nil {
			t.Fatalf("WriteMalformed: %v", err)
		}
		c := NewCluster(t, func(string) (backend.Election, error) { return s.h.Open(t, e) }, s.h.Timing, 2, 0)
		for _, n := range c.Nodes {
			ev, _ := n.WaitEvent(t, 0, feedWait, "ignored", func(e base.Event) bool { return e.Type == base.EventIgnored })
			if !errors.Is(ev.Err, backend.ErrMalformedRecord) {
				t.Fatalf("%s: ignored event carries %v, want ErrMalformedRecord", n.ID, ev.Err)
			}
		}
		if ls := c.Leaders(); len(ls) != 0 {
			t.Fatalf("%v lead an election whose record is malformed", ids(ls))
		}
	})

	ruleRetried(t, "Two Feeds with one node id (two processes) are two nodes: one leads at a time, and each reports the other once, with an EventError matching ErrDuplicateID", func(t *testing.T) bool {
		c := newCluster(t, func(e string) (backend.Election, error) { return s.h.Open(t, e) }, s.h.Timing, []string{"node-0", "node-0"}, 2, nil)
		l := c.WaitLeader(t, c.Timing.ElectionTimeoutMax+margin)
		other := c.Nodes[0]
		if other == l {
			other = c.Nodes[1]
		}
		isDup := func(e base.Event) bool { return e.Type == base.EventError && errors.Is(e.Err, base.ErrDuplicateID) }
		// The follower sees the leader's writes: its node id, another
		// process's incarnation.
		other.WaitEvent(t, 0, feedWait, "an EventError matching ErrDuplicateID while the other process leads", isDup)
		if err := l.Feed.Resign(ctxFor(t)); err != nil {
			if c.LeaseRanOut(t, l, err) {
				return false
			}
			t.Fatalf("Resign: %v", err)
		}
		// The other process claims the vacancy at once; the one that
		// resigned waits for its election timeout, so sees it lead first.
		if l2 := c.WaitLeader(t, c.Timing.ElectionTimeoutMin, l); l2 != other {
			t.Fatalf("%s leads after %s resigned, want %s", l2.name, l.name, other.name)
		}
		l.WaitEvent(t, 0, feedWait, "an EventError matching ErrDuplicateID while the other process leads", isDup)
		for _, n := range c.Nodes {
			reports := 0
			for _, e := range n.Events() {
				if isDup(e) {
					reports++
				}
			}
			if reports != 1 {
				t.Errorf("%s: %d EventErrors matching ErrDuplicateID, want exactly one", n.name, reports)
			}
			if n.Feed.Health().DuplicateSeen.IsZero() {
				t.Errorf("%s: Health.DuplicateSeen is zero after it reported the other process", n.name)
			}
		}
		return true
	})
}
