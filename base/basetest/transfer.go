package basetest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// Presence timing of the transfer and priority rules: short, so that the
// rules run in a second or two; ScaleEnv stretches it with the rest.
var (
	presenceInterval = Scaled(60 * time.Millisecond)
	presenceTTL      = 4 * presenceInterval
	hysteresis       = Scaled(300 * time.Millisecond)
)

// participate makes every node a participant with the rules' presence
// timing; priority, when not nil, gives node i's priority.
func participate(priority func(i int) int) func(i int, o *base.Options) {
	return func(i int, o *base.Options) {
		o.Participate = true
		o.PresenceInterval, o.PresenceTTL, o.PriorityHysteresis = presenceInterval, presenceTTL, hysteresis
		if priority != nil {
			o.Priority = priority(i)
		}
	}
}

// presenceBackend returns whether the harness's backends keep presence
// records, skipping the test with the reason when they do not.
func (s *suite) needPresence(t *testing.T) {
	t.Helper()
	b := s.open(t, Election())
	pb, ok := b.(backend.PresenceElection)
	if !ok {
		t.Skipf("the backend (%T) has no presence capability (backend.PresenceElection)", b)
	}
	if _, _, err := pb.Participants(ctxFor(t)); errors.Is(err, backend.ErrUnsupported) {
		t.Skipf("the store keeps no presence records: %v", err)
	} else if err != nil {
		t.Fatalf("Participants: %v", err)
	}
}

// waitParticipants waits up to d until n's Participants satisfy pass, and
// returns them.
func waitParticipants(t *testing.T, n *Node, d time.Duration, what string, pass func([]backend.Presence) bool) []backend.Presence {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ps, err := n.Feed.Participants(ctxFor(t))
		if err != nil {
			t.Fatalf("%s: Participants: %v", n.ID, err)
		}
		if pass(ps) {
			return ps
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: participants %v after %v, want %s", n.ID, nodes(ps), d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func nodes(ps []backend.Presence) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Node)
	}
	return out
}

func joinedTimes(ps []backend.Presence) []time.Time {
	var out []time.Time
	for _, p := range ps {
		out = append(out, p.Joined)
	}
	return out
}

func listed(ps []backend.Presence, id string) bool {
	return slices.ContainsFunc(ps, func(p backend.Presence) bool { return p.Node == id })
}

func (s *suite) transfers(t *testing.T) {
	rule(t, "A vacant record reserved for a successor is stored and returned with it, and other records read with no successor", func(t *testing.T) {
		b := s.open(t, Election())
		r1 := write(t, b, heartbeat.Record{}, "node-a", 1, nil)
		if r1.Successor != "" {
			t.Fatalf("a record written without a successor reads %q", r1.Successor)
		}
		ch, _ := subscribe(t, b)
		r2, err := b.Heartbeat(ctxFor(t), r1, heartbeat.Record{Election: b.Name(), Term: 1, Successor: "node-b"})
		if err != nil {
			t.Fatalf("Heartbeat of a reserved vacancy: %v", err)
		}
		if r2.Successor != "node-b" || r2.Leader != "" || r2.Revision != 2 {
			t.Fatalf("stored %v, want a vacancy of revision 2 reserved for node-b", r2)
		}
		got, err := b.Get(ctxFor(t))
		if err != nil || !got.Equal(r2) {
			t.Fatalf("Get = %v, %v; Heartbeat returned %v", got, err, r2)
		}
		n := next(t, ch, feedWait, "the reserved vacancy", func(n backend.Notification) bool {
			return n.Type == backend.RecordChanged && n.Record.Revision == 2
		})
		if n.Record.Successor != "node-b" {
			t.Fatalf("the feed brought %v, want the successor node-b", n.Record)
		}
		r3 := write(t, b, r2, "node-b", 2, nil)
		if r3.Successor != "" {
			t.Fatalf("the successor's claim reads successor %q, want none", r3.Successor)
		}
		if _, err := b.Heartbeat(ctxFor(t), r3, heartbeat.Record{Election: b.Name(), Leader: "node-b", Term: 2, Successor: "node-c"}); !errors.Is(err, heartbeat.ErrInvalidRecord) {
			t.Fatalf("a led record with a successor: %v, want an error matching heartbeat.ErrInvalidRecord", err)
		}
	})

	rule(t, "A led record handed over in one write is stored and returned with its handover token, exactly up to MaxToken; a renewal without one reads 0, and a token on a vacancy or over MaxToken is refused", func(t *testing.T) {
		b := s.open(t, Election())
		r1 := write(t, b, heartbeat.Record{}, "node-a", 1, nil)
		if r1.Handover != 0 {
			t.Fatalf("a record written without a handover token reads %d", r1.Handover)
		}
		ch, _ := subscribe(t, b)
		r2, err := b.Heartbeat(ctxFor(t), r1, heartbeat.Record{Election: b.Name(), Leader: "node-b", Term: 2, Value: []byte("b"), Lease: time.Second, Handover: heartbeat.MaxToken})
		if err != nil {
			t.Fatalf("Heartbeat of a handover: %v", err)
		}
		if r2.Handover != heartbeat.MaxToken || r2.Leader != "node-b" || r2.Term != 2 || r2.Revision != 2 || r2.Lease != time.Second {
			t.Fatalf("stored %v, want node-b's record of term 2, revision 2, lease 1s and handover token %d (MaxToken)", r2, uint64(heartbeat.MaxToken))
		}
		got, err := b.Get(ctxFor(t))
		if err != nil || !got.Equal(r2) {
			t.Fatalf("Get = %v, %v; Heartbeat returned %v", got, err, r2)
		}
		n := next(t, ch, feedWait, "the handover", func(n backend.Notification) bool {
			return n.Type == backend.RecordChanged && n.Record.Revision == 2
		})
		if n.Record.Handover != heartbeat.MaxToken {
			t.Fatalf("the feed brought %v, want the handover token %d", n.Record, uint64(heartbeat.MaxToken))
		}
		_, err = b.Heartbeat(ctxFor(t), r1, heartbeat.Record{Election: b.Name(), Leader: "node-a", Term: 1})
		var ce *backend.ConflictError
		if !errors.As(err, &ce) || !ce.Current.Equal(r2) {
			t.Fatalf("a write on the revision before the handover: %v, want a conflict carrying %v", err, r2)
		}
		r3 := write(t, b, r2, "node-b", 2, []byte("b"))
		if r3.Handover != 0 {
			t.Fatalf("a renewal without a handover token reads %d, want 0", r3.Handover)
		}
		if got, err := b.Get(ctxFor(t)); err != nil || !got.Equal(r3) {
			t.Fatalf("Get = %v, %v; Heartbeat returned %v", got, err, r3)
		}
		for _, bad := range []heartbeat.Record{
			{Election: b.Name(), Term: 2, Handover: 1},
			{Election: b.Name(), Leader: "node-b", Term: 2, Handover: heartbeat.MaxToken + 1},
		} {
			if _, err := b.Heartbeat(ctxFor(t), r3, bad); !errors.Is(err, heartbeat.ErrInvalidRecord) {
				t.Fatalf("writing %v: %v, want an error matching heartbeat.ErrInvalidRecord", bad, err)
			}
		}
		if got, err := b.Get(ctxFor(t)); err != nil || !got.Equal(r3) {
			t.Fatalf("after refused writes Get = %v, %v; want %v unchanged", got, err, r3)
		}
	})

	rule(t, "Participants lists the live participants (observe-only ones as unable to lead), not the nodes that do not participate; a stopped one leaves at once, a crashed one after PresenceTTL", func(t *testing.T) {
		s.needPresence(t)
		c := NewClusterWith(t, s.open1(t), s.h.Timing, 4, 1, func(i int, o *base.Options) {
			if i != 3 { // node-3 does not participate
				participate(nil)(i, o)
			}
		})
		all := []string{"node-0", "node-1", "node-2", "observer-0"}
		ps := waitParticipants(t, c.Nodes[3], feedWait, "node-0..2 and observer-0", func(ps []backend.Presence) bool {
			return slices.Equal(slices.Sorted(slices.Values(nodes(ps))), all)
		})
		// In the order a leader picks a successor: priority (all equal
		// here), then the one that joined last, then the node id.
		if !slices.IsSortedFunc(ps, func(a, b backend.Presence) int {
			if c := b.Joined.Compare(a.Joined); c != 0 {
				return c
			}
			return strings.Compare(a.Node, b.Node)
		}) {
			t.Fatalf("participants %v, joined %v: want the one that joined last first, then by node id", nodes(ps), joinedTimes(ps))
		}
		for _, p := range ps {
			if p.CanLead != (p.Node != "observer-0") || p.Timestamp.IsZero() || string(p.Value) != "value of "+p.Node {
				t.Fatalf("presence %+v: want CanLead for campaigners only, a store timestamp and the node's value", p)
			}
		}
		if err := c.Nodes[1].Feed.Stop(ctxFor(t)); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		waitParticipants(t, c.Nodes[0], presenceInterval+margin, "node-1 gone once stopped", func(ps []backend.Presence) bool {
			return !listed(ps, "node-1")
		})
		c.Nodes[2].Faulty.Partition() // a crash: it refreshes nothing more
		// Still listed at once: its last refresh is younger than the TTL.
		if ps, err := c.Nodes[0].Feed.Participants(ctxFor(t)); err != nil || !listed(ps, "node-2") {
			t.Fatalf("participants %v, %v right after node-2 crashed: want it listed until its presence is PresenceTTL (%v) old", nodes(ps), err, presenceTTL)
		}
		waitParticipants(t, c.Nodes[0], presenceTTL+presenceInterval+margin, "node-2 gone after its presence expired", func(ps []backend.Presence) bool {
			return !listed(ps, "node-2")
		})
		c.Nodes[2].Faulty.Heal()
	})

	ruleRetried(t, "TransferTo a live participant hands leadership to it in milliseconds, in a new term; the old leader's context ends with ErrTransferred", func(t *testing.T) bool {
		s.needPresence(t)
		c := NewClusterWith(t, s.open1(t), s.h.Timing, 3, 0, participate(nil))
		l := c.WaitLeader(t, c.Timing.ElectionTimeoutMax+margin)
		waitParticipants(t, l, feedWait, "three participants", func(ps []backend.Presence) bool { return len(ps) == 3 })
		target := c.Nodes[(slices.Index(c.Nodes, l)+1)%3]
		ctx, term, _ := l.Feed.LeaderContext()
		start := time.Now()
		if err := l.Feed.TransferTo(ctxFor(t), target.ID); err != nil {
			if c.LeaseRanOut(t, l, err) {
				return false
			}
			t.Fatalf("TransferTo(%s): %v", target.ID, err)
		}
		if !errors.Is(context.Cause(ctx), base.ErrTransferred) {
			t.Fatalf("the old leader context ended with %v, want ErrTransferred", context.Cause(ctx))
		}
		l2 := c.WaitLeader(t, c.Timing.ElectionTimeoutMin, l)
		took := time.Since(start)
		t.Logf("transfer took %v", took)
		if l2 != target {
			t.Fatalf("%s leads after the transfer to %s", l2.ID, target.ID)
		}
		if term2, _ := l2.Feed.Term(); term2 <= term {
			t.Fatalf("the successor's term %d is not above the old term %d", term2, term)
		}
		e := l.WaitUnelected(t, term, feedWait, "unelected")
		if e.Reason != base.ReasonTransferred {
			t.Fatalf("unelected with reason %v, want transferred", e.Reason)
		}
		return true
	})

	ruleRetried(t, "With the default presence options, a participating leader's Resign and then Stop each hand the election over in one write: the next term, one new leader announced by every node, no claim", func(t *testing.T) bool {
		s.needPresence(t)
		c := NewClusterWith(t, s.open1(t), s.h.Timing, 3, 0, func(_ int, o *base.Options) { o.Participate = true })
		l := c.WaitLeader(t, c.Timing.ElectionTimeoutMax+margin)
		live := c.Nodes // Stop is the last step
		for _, step := range []string{"Resign", "Stop"} {
			waitParticipants(t, l, feedWait, "every node", func(ps []backend.Presence) bool { return len(ps) == len(live) })
			// The leader reads the participants once per (default)
			// presence interval, a quarter of the lease: give it two.
			time.Sleep(c.Timing.LeaseDuration / 2)
			before, _ := l.Feed.Leader()
			marks := make([]int, len(live))
			for i, n := range live {
				marks[i] = len(n.Events())
			}
			var err error
			if step == "Resign" {
				err = l.Feed.Resign(ctxFor(t))
			} else {
				err = l.Feed.Stop(ctxFor(t))
			}
			if err != nil {
				if c.LeaseRanOut(t, l, err) {
					return false
				}
				t.Fatalf("%s: %v", step, err)
			}
			l2 := c.WaitLeader(t, c.Timing.ElectionTimeoutMin, l)
			el, _ := l2.WaitEvent(t, marks[slices.Index(live, l2)], feedWait, "elected", func(e base.Event) bool { return e.Type == base.EventElected })
			if el.Term != before.Term+1 || el.Record.Handover == 0 {
				t.Fatalf("after %s of %v, %s was elected on %v: want the next term, on the record that handed it over (a handover token), not on a claim of its own", step, before, l2.ID, el.Record)
			}
			// A second new leader (a successor that could not take the
			// handover claims at once) would follow within milliseconds.
			time.Sleep(c.Timing.HeartbeatInterval)
			for i, n := range live {
				if n == l && step == "Stop" {
					continue // its events end with Stop
				}
				var news []string
				for _, e := range n.Events()[marks[i]:] {
					if e.Type == base.EventNewLeader {
						news = append(news, fmt.Sprintf("%s term %d", e.Leader, e.Term))
					}
				}
				if want := fmt.Sprintf("%s term %d", l2.ID, before.Term+1); len(news) != 1 || news[0] != want {
					t.Fatalf("after %s, %s announced %q, want exactly %q", step, n.ID, news, want)
				}
			}
			l = l2
		}
		return true
	})

	ruleRetried(t, "A leader hands over to the live participant that joined last, on a view read when it gives up: never to one that stopped just before, even if its last Priority check listed it", func(t *testing.T) bool {
		s.needPresence(t)
		c := NewClusterWith(t, s.open1(t), s.h.Timing, 4, 0, func(_ int, o *base.Options) { o.Participate = true })
		l := c.WaitLeader(t, c.Timing.ElectionTimeoutMax+margin)
		// successor returns the participant l should pick once skip left:
		// the first, other than l and skip, in the order Participants
		// gives (priority, then joined last, then node id).
		successor := func(l *Node, skip ...*Node) *Node {
			ps := waitParticipants(t, l, feedWait, "every node", func(ps []backend.Presence) bool { return len(ps) == len(c.Nodes) })
			for _, p := range ps {
				if p.Node == l.ID || slices.ContainsFunc(skip, func(n *Node) bool { return n.ID == p.Node }) {
					continue
				}
				return c.Nodes[slices.IndexFunc(c.Nodes, func(n *Node) bool { return n.ID == p.Node })]
			}
			t.Fatalf("no participant for %s to hand over to", l.ID)
			return nil
		}
		// handed waits for want to lead on the record handing it the next
		// term; false when the record reached want after the lease it
		// granted (a loaded machine: a quarter of the lease is left for
		// the delivery), so that want claimed the term after at once.
		handed := func(step string, before heartbeat.Record, want *Node, gone ...*Node) (*Node, bool) {
			l2 := c.WaitLeader(t, c.Timing.ElectionTimeoutMin, gone...)
			el, _ := l2.WaitEvent(t, 0, feedWait, "elected", func(e base.Event) bool { return e.Type == base.EventElected && e.Term > before.Term })
			if l2 == want && el.Term == before.Term+2 && el.Record.Handover == 0 {
				t.Logf("after %s, %s claimed term %d at once: the handover of term %d reached it after the lease it granted", step, l2.ID, el.Term, before.Term+1)
				return l2, false
			}
			if l2 != want || el.Term != before.Term+1 || el.Record.Handover == 0 {
				t.Fatalf("after %s of %v, %s was elected in term %d on %v: want %s, handed the next term in one write", step, before, l2.ID, el.Term, el.Record, want.ID)
			}
			return l2, true
		}
		// Resign with every node live: the one that joined last.
		time.Sleep(c.Timing.LeaseDuration / 2) // the leader's Priority check read them all
		want := successor(l)
		before, _ := l.Feed.Leader()
		if err := l.Feed.Resign(ctxFor(t)); err != nil {
			if c.LeaseRanOut(t, l, err) {
				return false
			}
			t.Fatalf("Resign: %v", err)
		}
		var ok bool
		if l, ok = handed("Resign", before, want); !ok {
			return false
		}
		// The one l would pick stops; l stops right after, before any
		// Priority check of its own could read the participants again.
		time.Sleep(c.Timing.LeaseDuration / 2)
		gone := successor(l)
		after := successor(l, gone)
		if err := gone.Feed.Stop(ctxFor(t)); err != nil {
			t.Fatalf("Stop of %s: %v", gone.ID, err)
		}
		before, _ = l.Feed.Leader()
		if err := l.Feed.Stop(ctxFor(t)); err != nil {
			if c.LeaseRanOut(t, l, err) {
				return false
			}
			t.Fatalf("Stop: %v", err)
		}
		_, ok = handed("Stop", before, after, l, gone)
		return ok
	})

	ruleRetried(t, "Bad transfers fail with distinct errors and the leader keeps leading: to itself, to an unknown node, to an observe-only participant, by a follower", func(t *testing.T) bool {
		s.needPresence(t)
		c := NewClusterWith(t, s.open1(t), s.h.Timing, 2, 1, participate(nil))
		l := c.WaitLeader(t, c.Timing.ElectionTimeoutMax+margin)
		waitParticipants(t, l, feedWait, "three participants", func(ps []backend.Presence) bool { return len(ps) == 3 })
		follower := c.Nodes[1-slices.Index(c.Nodes, l)]
		_, term, _ := l.Feed.LeaderContext()
		for _, tc := range []struct {
			by, to string
			want   error
		}{
			{l.ID, l.ID, base.ErrTransferToSelf},
			{l.ID, "nobody", base.ErrUnknownParticipant},
			{l.ID, "observer-0", base.ErrTargetCannotLead},
			{follower.ID, l.ID, base.ErrNotLeader},
		} {
			n := l
			if tc.by != l.ID {
				n = follower
			}
			if err := n.Feed.TransferTo(ctxFor(t), tc.to); !errors.Is(err, tc.want) {
				t.Errorf("TransferTo(%q) by %s: %v, want an error matching %v", tc.to, tc.by, err, tc.want)
			}
		}
		if err := c.Nodes[2].Feed.TransferTo(ctxFor(t), l.ID); !errors.Is(err, base.ErrObserveOnly) {
			t.Errorf("TransferTo by an observer: %v, want ErrObserveOnly", err)
		}
		if term2, ok := l.Feed.Term(); !ok || term2 != term {
			if c.RequireLeaseEndsOnly(t) > 0 {
				return false // the lease ran out meanwhile, not by a transfer
			}
			t.Fatalf("after the refused transfers the leader leads %v in term %d, want term %d", ok, term2, term)
		}
		return true
	})

	ruleRetried(t, "A transfer to a node that died meanwhile costs no more than a crash: another node leads within the election timeout", func(t *testing.T) bool {
		s.needPresence(t)
		c := NewClusterWith(t, s.open1(t), s.h.Timing, 3, 0, participate(nil))
		l := c.WaitLeader(t, c.Timing.ElectionTimeoutMax+margin)
		waitParticipants(t, l, feedWait, "three participants", func(ps []backend.Presence) bool { return len(ps) == 3 })
		target := c.Nodes[(slices.Index(c.Nodes, l)+1)%3]
		target.Faulty.Partition() // dead, but its presence is still live
		start := time.Now()
		if err := l.Feed.TransferTo(ctxFor(t), target.ID); err != nil {
			if c.LeaseRanOut(t, l, err) {
				return false
			}
			t.Fatalf("TransferTo(%s): %v", target.ID, err)
		}
		bound := c.Timing.ElectionTimeoutMax + c.Timing.HeartbeatInterval + margin
		l2 := c.waitLeaderOrStall(t, bound, target)
		if l2 == nil {
			target.Faulty.Heal()
			return false
		}
		t.Logf("%s leads %v after the transfer to the dead %s (election timeout %v..%v)", l2.ID, time.Since(start), target.ID, c.Timing.ElectionTimeoutMin, c.Timing.ElectionTimeoutMax)
		if d := time.Since(start); d < c.Timing.ElectionTimeoutMin {
			t.Fatalf("%s claimed the vacancy reserved for %s after %v, before its election timeout %v", l2.ID, target.ID, d, c.Timing.ElectionTimeoutMin)
		}
		target.Faulty.Heal()
		return true
	})

	ruleUnderLoad(t, "A leader hands over to a live participant of higher priority once it has been present for the hysteresis, and only to it; the node of highest priority never hands over", func(t *testing.T, late bool) {
		s.needPresence(t)
		retried(t, func(t *testing.T) bool {
			c := NewClusterWith(t, s.open1(t), s.h.Timing, 3, 0, participate(func(i int) int {
				if i == 2 {
					return 5
				}
				return 0
			}))
			preferred := c.Nodes[2]
			// The preferred node leads by winning an election or by a handover
			// after the hysteresis; after a lease ran out, again so. It
			// reports false when it did not because the store did not answer
			// the claims (a loaded machine): the rule runs again.
			waitPreferred := func(what string) bool {
				t.Helper()
				deadline := time.Now().Add(c.Timing.ElectionTimeoutMax + hysteresis + 3*presenceInterval + 2*margin)
				for !preferred.Feed.IsLeader() {
					if time.Now().After(deadline) {
						if n := c.claimsTimedOut(); n > 0 {
							t.Logf("the node of higher priority does not lead %s: %d claims ran out of time in the store (a loaded machine)", what, n)
							return false
						}
						t.Fatalf("the node of higher priority does not lead %s (leaders: %v)", what, ids(c.Leaders()))
					}
					time.Sleep(2 * time.Millisecond)
				}
				return true
			}
			if !waitPreferred("at first") {
				return false
			}
			if late {
				c.DelayRenewal(preferred)
				c.WaitLeaseEnd(t, preferred)
				if !waitPreferred("again after its lease ran out") {
					return false
				}
			}
			// It keeps leading: nobody has a higher priority.
			time.Sleep(hysteresis + 3*presenceInterval)
			if !waitPreferred("after the hysteresis") {
				return false
			}
			handovers := 0
			for _, n := range c.Nodes {
				var elected time.Time
				for _, e := range n.Events() {
					switch {
					case e.Type == base.EventElected:
						elected = e.At
					case e.Type == base.EventUnelected && e.Reason == base.ReasonTransferred:
						if n == preferred {
							t.Fatalf("the node of highest priority transferred leadership away")
						}
						handovers++
						if d := e.At.Sub(elected); d < hysteresis {
							t.Fatalf("%s handed over %v after it was elected, before the hysteresis %v", n.ID, d, hysteresis)
						}
					}
				}
				for _, w := range n.Faulty.Writes() {
					if w.Next.Successor != "" && w.Next.Successor != preferred.ID {
						t.Fatalf("%s reserved the vacancy for %s, want only the preferred %s", n.ID, w.Next.Successor, preferred.ID)
					}
				}
			}
			// node-0 usually wins first and hands over; none when the
			// preferred node won the first election itself, more when a lease
			// ran out and a node of priority 0 won again.
			t.Logf("%d handover(s) by priority", handovers)
			return true
		})
	})

	ruleUnderLoad(t, "Two participants of equal priority never hand leadership to each other (no flapping)", func(t *testing.T, late bool) {
		s.needPresence(t)
		retried(t, func(t *testing.T) bool {
			c := NewClusterWith(t, s.open1(t), s.h.Timing, 2, 0, participate(func(int) int { return 3 }))
			l := c.waitLeaderOrStall(t, c.Timing.ElectionTimeoutMax+margin)
			if l == nil {
				return false
			}
			if late {
				c.DelayRenewal(l)
				c.WaitLeaseEnd(t, l)
			}
			time.Sleep(hysteresis + 4*presenceInterval)
			if c.waitLeaderOrStall(t, c.Timing.ElectionTimeoutMax+c.Timing.HeartbeatInterval+margin) == nil {
				return false
			}
			// A transfer would end a leadership with reason transferred; only
			// a lease that ran out may move it.
			c.RequireLeaseEndsOnly(t)
			for _, n := range c.Nodes {
				for _, w := range n.Faulty.Writes() {
					if w.Next.Successor != "" {
						t.Fatalf("%s reserved a vacancy for %s, a participant of equal priority", n.ID, w.Next.Successor)
					}
				}
			}
			return true
		})
	})
}

// storeAs opens a Store of the harness as capability T, and skips the
// rule when the harness opens no Stores or its Stores lack T.
func storeAs[T backend.Store](t *testing.T, s *suite) T {
	t.Helper()
	if s.h.OpenStore == nil {
		t.Skip("harness has no OpenStore")
	}
	st := s.openStore(t)
	c, ok := st.(T)
	if !ok {
		t.Skipf("the store (%T) is not a %v", st, reflect.TypeFor[T]())
	}
	return c
}

// presenceStore runs the PresenceStore rules when the harness opens Stores
// that keep presence records.
func (s *suite) presenceStore(t *testing.T) {
	rule(t, "Presence records are kept per election and node, stamped by the store, never announced on the changefeed, and deleted by Absent", func(t *testing.T) {
		ps := storeAs[backend.PresenceStore](t, s)
		e, other := Election(), Election()
		ch := storeSubscribe(t, ps)
		before := time.Now()
		for _, p := range []backend.Presence{
			{Node: "node-a", Value: []byte("a"), Priority: base.MaxPriority, CanLead: true},
			{Node: "node-b", Priority: base.MinPriority},
		} {
			if err := ps.Present(ctxFor(t), e, p); err != nil {
				t.Fatalf("Present(%s): %v", p.Node, err)
			}
		}
		if err := ps.Present(ctxFor(t), other, backend.Presence{Node: "node-a", CanLead: true}); err != nil {
			t.Fatalf("Present in another election: %v", err)
		}
		got, now, err := ps.Participants(ctxFor(t), e)
		if err != nil {
			t.Fatalf("Participants: %v", err)
		}
		slices.SortFunc(got, func(a, b backend.Presence) int { return a.Priority - b.Priority })
		if len(got) != 2 || got[0].Node != "node-b" || got[0].Priority != base.MinPriority || got[0].CanLead ||
			got[1].Node != "node-a" || got[1].Priority != base.MaxPriority || !got[1].CanLead || string(got[1].Value) != "a" {
			t.Fatalf("Participants = %+v, want node-a (priority %d, can lead, value a) and node-b (priority %d)", got, base.MaxPriority, base.MinPriority)
		}
		for _, p := range got {
			if p.Timestamp.IsZero() || now.Before(p.Timestamp) {
				t.Fatalf("presence %s stamped %v, store time %v: want a store timestamp not after the store's time", p.Node, p.Timestamp, now)
			}
			if d := p.Timestamp.Sub(before); d < -time.Hour || d > time.Hour {
				t.Errorf("presence timestamp %v is more than an hour from this machine's %v", p.Timestamp, before)
			}
		}
		// Presence writes are not election records: the first notification
		// after them is the record written next.
		storeWrite(t, ps, heartbeat.Record{}, e, "node-a", 1)
		n := nextStore(t, ch, "the election record", func(n backend.Notification) bool { return n.Type != backend.OtherChanged })
		if n.Type != backend.RecordChanged || n.Record.Election != e {
			t.Fatalf("the changefeed brought %v (election %q) first, want the election record of %s: a presence record was announced", n.Type, n.Election+n.Record.Election, e)
		}
		if err := ps.Absent(ctxFor(t), e, "node-a"); err != nil {
			t.Fatalf("Absent: %v", err)
		}
		if err := ps.Absent(ctxFor(t), e, "node-z"); err != nil {
			t.Fatalf("Absent of a node without a record: %v", err)
		}
		got, _, err = ps.Participants(ctxFor(t), e)
		if err != nil || len(got) != 1 || got[0].Node != "node-b" {
			t.Fatalf("Participants after Absent(node-a) = %+v, %v; want node-b alone", got, err)
		}
		if r, err := ps.Get(ctxFor(t), e); err != nil || r.Leader != "node-a" || r.Revision != 1 {
			t.Fatalf("the election record after presence writes: %v, %v", r, err)
		}
	})

	rule(t, "A presence record's token is stored and returned as written, exactly up to MaxToken, 0 as 0; each write replaces it, and a token over MaxToken is refused", func(t *testing.T) {
		ps := storeAs[backend.PresenceStore](t, s)
		e := Election()
		tokens := func(want map[string]uint64) {
			t.Helper()
			got, _, err := ps.Participants(ctxFor(t), e)
			if err != nil {
				t.Fatalf("Participants: %v", err)
			}
			have := map[string]uint64{}
			for _, p := range got {
				have[p.Node] = p.Token
			}
			if !maps.Equal(have, want) {
				t.Fatalf("Participants gave tokens %v, want %v", have, want)
			}
		}
		for _, p := range []backend.Presence{
			{Node: "node-a", CanLead: true, Token: heartbeat.MaxToken},
			{Node: "node-b", CanLead: true, Token: 1},
			{Node: "node-c", CanLead: true},
		} {
			if err := ps.Present(ctxFor(t), e, p); err != nil {
				t.Fatalf("Present(%s): %v", p.Node, err)
			}
		}
		tokens(map[string]uint64{"node-a": heartbeat.MaxToken, "node-b": 1, "node-c": 0})
		if err := ps.Present(ctxFor(t), e, backend.Presence{Node: "node-a", CanLead: true, Token: 7}); err != nil {
			t.Fatalf("Present(node-a) again: %v", err)
		}
		if err := ps.Present(ctxFor(t), e, backend.Presence{Node: "node-b", CanLead: true}); err != nil {
			t.Fatalf("Present(node-b) again: %v", err)
		}
		tokens(map[string]uint64{"node-a": 7, "node-b": 0, "node-c": 0})
		if err := ps.Present(ctxFor(t), e, backend.Presence{Node: "node-c", CanLead: true, Token: heartbeat.MaxToken + 1}); !errors.Is(err, heartbeat.ErrInvalidRecord) {
			t.Fatalf("Present with a token over MaxToken: %v, want an error matching heartbeat.ErrInvalidRecord", err)
		}
		tokens(map[string]uint64{"node-a": 7, "node-b": 0, "node-c": 0})
	})

	s.presenceJoined(t)
}

// batchSuccessor runs the rule of the successor field through
// HeartbeatBatch.
func (s *suite) batchSuccessor(t *testing.T) {
	rule(t, "HeartbeatBatch stores and returns the successor of a reserved vacancy, as Heartbeat does", func(t *testing.T) {
		bs := storeAs[backend.BatchStore](t, s)
		e1, e2 := Election(), Election()
		r1 := storeWrite(t, bs, heartbeat.Record{}, e1, "node-a", 1)
		res, err := bs.HeartbeatBatch(ctxFor(t), []backend.Write{
			{Expected: r1, Next: heartbeat.Record{Election: e1, Term: 1, Successor: "node-b"}},
			{Next: heartbeat.Record{Election: e2, Term: 4, Successor: "node-c"}},
		})
		if err != nil || len(res) != 2 {
			t.Fatalf("HeartbeatBatch: %v, %v", res, err)
		}
		for i, want := range []string{"node-b", "node-c"} {
			if res[i].Err != nil || res[i].Record.Successor != want || !res[i].Record.Vacant() {
				t.Fatalf("write %d: %+v, %v; want a vacancy reserved for %s", i, res[i].Record, res[i].Err, want)
			}
			got, err := bs.Get(ctxFor(t), res[i].Record.Election)
			if err != nil || !got.Equal(res[i].Record) {
				t.Fatalf("Get = %v, %v; the batch returned %v", got, err, res[i].Record)
			}
		}
	})
}

// batchHandover runs the rule of the handover token through
// HeartbeatBatch and GetBatch.
func (s *suite) batchHandover(t *testing.T) {
	rule(t, "HeartbeatBatch and GetBatch store and return the handover token of a led record, as Heartbeat and Get do; a write with an invalid token fails alone", func(t *testing.T) {
		bs := storeAs[backend.BatchStore](t, s)
		e1, e2, e3, e4 := Election(), Election(), Election(), Election()
		r1 := storeWrite(t, bs, heartbeat.Record{}, e1, "node-a", 1)
		r3 := storeWrite(t, bs, heartbeat.Record{}, e3, "node-a", 1)
		res, err := bs.HeartbeatBatch(ctxFor(t), []backend.Write{
			{Expected: r1, Next: heartbeat.Record{Election: e1, Leader: "node-b", Term: 2, Lease: time.Second, Handover: heartbeat.MaxToken}},
			{Next: heartbeat.Record{Election: e2, Leader: "node-c", Term: 1, Handover: 1}},
			{Expected: r3, Next: heartbeat.Record{Election: e3, Term: 1, Handover: 5}},
			{Next: heartbeat.Record{Election: e4, Leader: "node-d", Term: 1, Handover: heartbeat.MaxToken + 1}},
		})
		if err != nil || len(res) != 4 {
			t.Fatalf("HeartbeatBatch: %v, %v", res, err)
		}
		for i, want := range []uint64{heartbeat.MaxToken, 1} {
			if res[i].Err != nil || res[i].Record.Handover != want || res[i].Record.Vacant() {
				t.Fatalf("write %d: %+v, %v; want a led record with handover token %d", i, res[i].Record, res[i].Err, want)
			}
			got, err := bs.Get(ctxFor(t), res[i].Record.Election)
			if err != nil || !got.Equal(res[i].Record) {
				t.Fatalf("Get = %v, %v; the batch returned %v", got, err, res[i].Record)
			}
		}
		for _, i := range []int{2, 3} { // a vacancy with a token, a token over MaxToken
			if !errors.Is(res[i].Err, heartbeat.ErrInvalidRecord) {
				t.Fatalf("write %d: %+v, %v; want an error matching heartbeat.ErrInvalidRecord", i, res[i].Record, res[i].Err)
			}
		}
		if got, err := bs.Get(ctxFor(t), e3); err != nil || !got.Equal(r3) {
			t.Fatalf("Get(%s) = %v, %v after a refused write; want %v unchanged", e3, got, err, r3)
		}
		// A stale write in a batch gets a conflict carrying the handover.
		stale, err := bs.HeartbeatBatch(ctxFor(t), []backend.Write{{Expected: r1, Next: heartbeat.Record{Election: e1, Leader: "node-a", Term: 1}}})
		var ce *backend.ConflictError
		if err != nil || len(stale) != 1 || !errors.As(stale[0].Err, &ce) || !ce.Current.Equal(res[0].Record) {
			t.Fatalf("stale write in a batch: %+v, %v; want a conflict carrying %v", stale, err, res[0].Record)
		}
		br, ok := bs.(backend.BatchReader)
		if !ok {
			return
		}
		rs, err := br.GetBatch(ctxFor(t), []string{e2, e1})
		if err != nil || len(rs) != 2 || rs[0].Err != nil || !rs[0].Record.Equal(res[1].Record) || rs[1].Err != nil || !rs[1].Record.Equal(res[0].Record) {
			t.Fatalf("GetBatch = %+v, %v; want %v and %v as written, handover tokens included", rs, err, res[1].Record, res[0].Record)
		}
	})
}

// open1 is the open function of a cluster on the harness's backends.
func (s *suite) open1(t *testing.T) func(string) (backend.Election, error) {
	return func(e string) (backend.Election, error) { return s.h.Open(t, e) }
}
