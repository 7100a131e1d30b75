package base

// Regressions of issue 40 (a third independent review) and of issue 39's
// shared node ids, each on the machine alone: the inputs of the faulty
// schedule, stepped at the instants the review found, with the clock
// reading the same instant wherever it did.

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// replyTo returns the answer effs give to the reply channel ch, or nil.
func replyTo(effs []effect, ch chan error) *error {
	for _, e := range effs {
		if r, ok := e.(reply); ok && r.to == (chan<- error)(ch) {
			return &r.err
		}
	}
	return nil
}

func changed(r heartbeat.Record) notificationInput {
	return notificationInput{n: backend.Notification{Type: backend.RecordChanged, Record: r}, ok: true}
}

// A read asked for before the step that observed a newer record is not
// authoritative, even when its reply comes at the same clock reading: the
// node never goes back to a handover it took and gave up (the review's
// two leaders for 43 ms, "term did not increase"), and its view never goes
// back.
func TestMachineSameInstantReplyIsNotNewer(t *testing.T) {
	now := at(10 * time.Millisecond) // every step below reads this instant
	m := participating(follower(t, rec(3, "x", 1, timing.LeaseDuration), at(5*time.Millisecond)))
	tok := presenceToken(t, m, now)
	rd := findCall(m.step(now, subscribedInput{ok: true}), callRead) // the reopened feed reads (held)
	if rd == nil {
		t.Fatal("the opened feed sent no read")
	}
	h := rec(4, "a", 2, timing.LeaseDuration)
	h.Handover = tok
	m.step(now, changed(h))
	if m.role != roleLeader || m.term != 2 {
		t.Fatalf("role %v term %d, want leading term 2 on the handover", m.role, m.term)
	}
	done := make(chan error, 1)
	vc := findCall(viewed(m, now, m.step(now, requestInput{r: request{kind: reqResign, ctx: context.Background(), reply: done}}), nil, now), callVacancy)
	v := rec(5, "", 2, 0)
	m.step(now, callResult{kind: callVacancy, expected: vc.expected, next: vc.next, sentAt: now, sentStep: vc.sentStep, parent: vc.parent, res: v})
	effs := m.step(now, callResult{kind: callRead, sentAt: now, sentStep: rd.sentStep, res: h})
	if m.role == roleLeader {
		t.Fatalf("leads term %d again on the handover it resigned, from a read sent before the vacancy was seen", m.term)
	}
	if !m.rec.SameWrite(v) {
		t.Fatalf("view went back to %v, want %v", m.rec, v)
	}
	if ev := findEvent(effs, EventNewLeader); ev != nil {
		t.Fatalf("announced %q term %d from the stale read", ev.Leader, ev.Term)
	}
	// A read asked for in the step that observed the record, or later,
	// is authoritative: a store that lost the vacancy is believed.
	rd2 := findCall(m.step(now, subscribedInput{ok: true}), callRead)
	if rd2 == nil || !m.current(rd2.sentStep) || m.current(rd.sentStep) {
		t.Fatalf("current: read of step %d (after the observation in step %d) %v, of step %d %v",
			rd2.sentStep, m.observedIn, m.current(rd2.sentStep), rd.sentStep, m.current(rd.sentStep))
	}
}

// A handover this process took and gave up is never taken again, however
// the record comes back.
func TestMachineHandoverNeverRetaken(t *testing.T) {
	m := participating(follower(t, rec(3, "x", 1, timing.LeaseDuration), at(5*time.Millisecond)))
	tok := presenceToken(t, m, at(10*time.Millisecond))
	h := rec(4, "a", 2, timing.LeaseDuration)
	h.Handover = tok
	m.step(at(11*time.Millisecond), changed(h))
	m.step(at(12*time.Millisecond), leaseLostInput{expired: true})
	m.leaderCtx = nil
	if m.role == roleLeader {
		t.Fatal("still leading after the lease was lost")
	}
	m.rec.Revision = 0 // forget the record: it comes back as new
	m.seen = false
	m.step(at(13*time.Millisecond), changed(h))
	if m.role == roleLeader {
		t.Fatal("took the handover it gave up once more")
	}
}

// The value a handover publishes is the successor's value in force: a
// participant writes its presence with the value a successful Proclaim
// made its own, not Options.Value.
func TestMachinePresenceCarriesTheProclaimedValue(t *testing.T) {
	m, _ := leader(t)
	participating(m)
	reply := make(chan error, 1)
	now := at(30 * time.Millisecond)
	c := findCall(m.step(now, requestInput{r: request{kind: reqProclaim, value: []byte("a:2"), reply: reply}}), callRenew)
	res := c.next
	res.Revision = 2
	m.step(at(31*time.Millisecond), callResult{kind: callRenew, expected: c.expected, next: c.next, sentAt: now, sentStep: c.sentStep, res: res})
	if got := replyTo(m.step(at(31*time.Millisecond), leaseExtendedInput{ok: true}), reply); got == nil || *got != nil {
		t.Fatalf("Proclaim answered %v, want nil", got)
	}
	for _, e := range m.step(at(40*time.Millisecond), timerInput{timerPresence}) {
		if pc, ok := e.(presenceCall); ok {
			if string(pc.value) != "a:2" {
				t.Fatalf("presence written with value %q, want the proclaimed %q", pc.value, "a:2")
			}
			return
		}
	}
	t.Fatal("no presence write")
}

// A Proclaim whose caller gave up before the renewal carrying it came
// back has no later effect: its value is not the node's, the next renewal
// (sent at once) writes the value in force, and later terms publish it.
// One the engine took first is the node's, whatever the caller's context
// does after.
func TestMachineGivenUpProclaimHasNoLaterEffect(t *testing.T) {
	m, _ := leader(t)
	ctx, cancel := context.WithCancel(context.Background())
	reply := make(chan error, 1)
	s := new(settle)
	now := at(30 * time.Millisecond)
	c := findCall(m.step(now, requestInput{r: request{kind: reqProclaim, ctx: ctx, value: []byte("a:2"), reply: reply, settle: s}}), callRenew)
	cancel()
	if !s.giveUp() {
		t.Fatal("the caller could not give up before the engine took it")
	}
	res := c.next
	res.Revision = 2
	m.step(at(31*time.Millisecond), callResult{kind: callRenew, expected: c.expected, next: c.next, sentAt: now, sentStep: c.sentStep, res: res})
	effs := m.step(at(31*time.Millisecond), leaseExtendedInput{ok: true})
	if string(m.value) != "a:1" {
		t.Fatalf("value %q in force after a given-up Proclaim, want %q", m.value, "a:1")
	}
	if got := replyTo(effs, reply); got == nil || !errors.Is(*got, context.Canceled) {
		t.Fatalf("reply %v, want the context's error", got)
	}
	if rn := findCall(effs, callRenew); rn == nil || string(rn.next.Value) != "a:1" {
		t.Fatalf("renewal %+v: want one sent at once with the value in force", rn)
	}

	// Taken first: the caller cannot give up any more.
	s2 := new(settle)
	if !s2.take() || s2.giveUp() {
		t.Fatal("settle: the engine took it, yet the caller gave up")
	}
}

// A follower whose claim was refused, and that has no reason to claim
// again while another node renews, stops reporting the refusal once a
// retry would have been made: its Health recovers by itself.
func TestMachineFollowersRefusalClears(t *testing.T) {
	m, c, sent := claiming(t)
	refused := errors.Join(ErrRefused, errors.New("permission denied for table"))
	m.step(at(15*time.Millisecond), callResult{kind: callClaim, expected: c.expected, next: c.next, sentAt: sent, sentStep: c.sentStep, err: refused})
	if m.health.Refused == nil {
		t.Fatal("the refusal is not in Health")
	}
	hold := refusalRetry(m.t) + m.t.ElectionTimeoutMax
	var rev uint64 = 1
	for d := 20 * time.Millisecond; d < hold+time.Second; d += m.t.HeartbeatInterval {
		rev++
		m.step(at(d), changed(rec(rev, "b", 1, timing.LeaseDuration)))
		if m.writing {
			t.Fatalf("at %v: claimed while another node renews", d)
		}
		switch {
		case d < 15*time.Millisecond+hold && m.health.Refused == nil:
			t.Fatalf("at %v: the refusal was forgotten before a retry could have been made", d)
		case d >= 15*time.Millisecond+hold && m.health.Refused != nil:
			t.Fatalf("at %v: Health still says the store refuses, %v after the refusal", d, d)
		}
	}
}

// A node whose own vacancy write is in flight when the election is handed
// to it takes the handover once that write ends, rather than claiming with
// a new term later.
func TestMachineHandoverTakenAfterOwnVacancy(t *testing.T) {
	m, _ := leader(t)
	participating(m)
	done := make(chan error, 1)
	vc := findCall(viewed(m, at(30*time.Millisecond), m.step(at(30*time.Millisecond), requestInput{r: request{kind: reqResign, ctx: context.Background(), reply: done}}), nil, at(time.Hour)), callVacancy)
	tok := presenceToken(t, m, at(31*time.Millisecond))
	// Another node claimed (the vacancy hangs), then handed it back.
	h := rec(3, "a", 3, timing.LeaseDuration)
	h.Handover = tok
	m.step(at(32*time.Millisecond), changed(h))
	if m.role == roleLeader {
		t.Fatal("took the handover while its own write was in flight")
	}
	m.step(at(33*time.Millisecond), callResult{kind: callVacancy, expected: vc.expected, next: vc.next, sentAt: at(30 * time.Millisecond), sentStep: vc.sentStep, parent: vc.parent, err: backend.NewConflict(h)})
	if m.role != roleLeader || m.term != 3 {
		t.Fatalf("role %v term %d once the vacancy ended, want leading term 3 on the handover", m.role, m.term)
	}
}

// Two processes with one node id are two nodes: the loser of a claim race
// does not take the winner's record for its own lost claim (which it would
// claim again at once, deposing the winner within its lease); it waits as
// for any heartbeat. Each reports the other once: an EventError matching
// ErrDuplicateID, and Health.
func TestMachineSharedNodeIDIsTwoNodes(t *testing.T) {
	r := rec(5, "x", 3, timing.LeaseDuration)
	a := follower(t, r, at(5*time.Millisecond))
	b := follower(t, r, at(5*time.Millisecond))
	b.inc = testInc + 1 // another process's draw
	ca := findCall(a.step(at(500*time.Millisecond), timerInput{timerClaim}), callClaim)
	cb := findCall(b.step(at(500*time.Millisecond), timerInput{timerClaim}), callClaim)
	if ca == nil || cb == nil || ca.next.Term != cb.next.Term || ca.next.Incarnation == cb.next.Incarnation {
		t.Fatalf("claims %+v and %+v: want one term, two incarnations", ca, cb)
	}
	won := ca.next
	won.Revision = 6
	a.step(at(501*time.Millisecond), callResult{kind: callClaim, expected: ca.expected, next: ca.next, sentAt: ca.sentAt, sentStep: ca.sentStep, res: won})
	if a.role != roleLeader {
		t.Fatal("the winner does not lead")
	}
	effs := b.step(at(501*time.Millisecond), callResult{kind: callClaim, expected: cb.expected, next: cb.next, sentAt: cb.sentAt, sentStep: cb.sentStep, err: backend.NewConflict(won)})
	if b.claimableAtOnce() || b.claimDue(at(502*time.Millisecond)) {
		t.Fatal("the loser takes the winner's record for its own and claims at once")
	}
	if !b.health.DuplicateSeen.IsZero() {
		t.Fatal("one write of another incarnation (perhaps the late renewal of the process before this one) was reported")
	}
	var dup int
	for _, e := range effs {
		if em, ok := e.(*emit); ok && em.ev.Type == EventError && errors.Is(em.ev.Err, ErrDuplicateID) {
			dup++
		}
	}
	// Its renewals seen next, through the feed: the first could be the
	// late commit of a process before this one (the won record was seen
	// in a conflict, perhaps committed before this process started); the
	// second is reported, once as an event, in Health every time after.
	renewed := won
	for i, d := range []time.Duration{550 * time.Millisecond, 600 * time.Millisecond, 650 * time.Millisecond} {
		renewed.Revision = uint64(7 + i)
		for _, e := range b.step(at(d), changed(renewed)) {
			if em, ok := e.(*emit); ok && em.ev.Type == EventError {
				dup++
			}
		}
		if seen := !b.health.DuplicateSeen.IsZero(); seen != (i > 0) {
			t.Fatalf("renewal %d of the other process: in Health %v, want %v", i+1, seen, i > 0)
		}
	}
	if dup != 1 {
		t.Fatalf("%d EventErrors of the duplicate id, want exactly 1", dup)
	}
	if !b.health.DuplicateSeen.Equal(at(650 * time.Millisecond)) {
		t.Fatalf("DuplicateSeen %v, want the last sighting", b.health.DuplicateSeen)
	}
	// The winner renews on its own record: b's write would be foreign to it.
	foreign := renewed
	foreign.Incarnation = b.inc
	if !a.own(won) || a.own(foreign) {
		t.Fatal("own: the winner's record is not its own, or the other process's is")
	}
}

// A record of this node from before this process started (a previous
// incarnation's last renewal) is no duplicate.
func TestMachineEarlierIncarnationIsNoDuplicate(t *testing.T) {
	old := rec(5, "a", 3, timing.LeaseDuration)
	old.Incarnation = testInc + 1
	m := follower(t, old, at(5*time.Millisecond))
	if !m.health.DuplicateSeen.IsZero() {
		t.Fatal("the record found at start was taken for a duplicate")
	}
	if m.claimableAtOnce() {
		t.Fatal("an earlier incarnation's record is claimed at once: its lease may still run")
	}
}
