package base

// Transition tests: the machine is driven directly, one input at a time at
// instants the test chooses, and the effects it returns are compared
// exactly. No goroutine, no timer, no store and no synctest.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

var (
	t0     = time.Unix(1_000_000, 0)
	timing = heartbeat.Timing{
		HeartbeatInterval:  100 * time.Millisecond,
		ElectionTimeoutMin: 300 * time.Millisecond,
		ElectionTimeoutMax: 600 * time.Millisecond,
		LeaseDuration:      250 * time.Millisecond,
		VacancyJitter:      20 * time.Millisecond,
	}
)

// halfRand draws the middle of every range: the election timeout is
// 450 ms, the vacancy jitter 10 ms.
type halfRand struct{}

func (halfRand) Int64N(n int64) int64 { return n / 2 }

const (
	testInc         = 1 + heartbeat.MaxToken/2 // the incarnation halfRand draws
	electionTimeout = 450 * time.Millisecond   // ElectionTimeout(halfRand{})
	jitter          = 10 * time.Millisecond    // Jitter(halfRand{})
)

func at(d time.Duration) time.Time { return t0.Add(d) }

func newTestMachine(t *testing.T, opts Options) *machine {
	t.Helper()
	if err := timing.Validate(); err != nil {
		t.Fatal(err)
	}
	opts.Rand = halfRand{}
	m := newMachine("a", "e", timing, opts)
	m.inc = testInc // drawn from the global source: fixed here to compare records
	return m
}

// started is a machine after startInput at t0, with its first read in
// flight.
func started(t *testing.T) *machine {
	m := newTestMachine(t, Options{Value: []byte("a:1")})
	expect(t, m.step(t0, startInput{}),
		openFeed{},
		&startCall{kind: callRead, sentAt: t0, deadline: at(300 * time.Millisecond)},
		&setTimer{t: timerPoll, at: at(100 * time.Millisecond)},
	)
	return m
}

// follower is a machine whose first read, sent at t0, returned rec at
// instant when.
func follower(t *testing.T, rec heartbeat.Record, when time.Time) *machine {
	m := started(t)
	m.step(when, callResult{kind: callRead, sentAt: t0, res: rec})
	if m.role != roleFollower || !m.rec.SameWrite(rec) {
		t.Fatalf("after the read: role %v, record %v", m.role, m.rec)
	}
	return m
}

// leader is a machine that won term 1 (revision 1) with a claim sent at
// t0+10ms and answered at t0+20ms; the store had no record.
func leader(t *testing.T) (*machine, heartbeat.Record) {
	m, c, _ := claiming(t)
	res := c.next
	res.Revision = 1
	m.step(at(20*time.Millisecond), callResult{kind: callClaim, expected: c.expected, next: c.next, sentAt: c.sentAt, res: res})
	if m.role != roleLeader || m.term != 1 {
		t.Fatalf("not leading after the claim: role %v term %d", m.role, m.term)
	}
	return m, res
}

// claiming is a machine whose first read found no record and whose first
// claim (c, term 1 on no record) was sent at t0+10ms, its reply not in yet.
func claiming(t *testing.T) (*machine, *startCall, time.Time) {
	t.Helper()
	m := started(t)
	m.step(at(5*time.Millisecond), callResult{kind: callRead, sentAt: t0, err: backend.ErrNotFound})
	sent := at(10 * time.Millisecond)
	effs := m.step(sent, timerInput{timerClaim})
	c, ok := effs[0].(*startCall)
	if len(effs) != 1 || !ok || c.kind != callClaim {
		t.Fatalf("claim timer: %v, want one claim", effs)
	}
	return m, c, sent
}

func rec(rev uint64, leader string, term uint64, lease time.Duration) heartbeat.Record {
	return heartbeat.Record{Election: "e", Revision: rev, Leader: leader, Term: term, Lease: lease}
}

// observed is what observe returns first for a record it takes in.
func observed(when time.Time, snap snapshot, leaseEnd time.Time, r heartbeat.Record) []effect {
	snap.record, snap.seen = r, true
	return []effect{
		&publish{snap: snap, leaseEnd: leaseEnd},
		logDebug{msg: "leaderfeed: record", args: []any{"leader", r.Leader, "term", r.Term, "revision", r.Revision}},
	}
}

func newLeader(when time.Time, r heartbeat.Record) *emit {
	return &emit{ev: Event{Type: EventNewLeader, At: when, Leader: r.Leader, Term: r.Term, Value: r.Value, Record: r}}
}

func cat(parts ...any) []effect {
	var out []effect
	for _, p := range parts {
		switch p := p.(type) {
		case effect:
			out = append(out, p)
		case []effect:
			out = append(out, p...)
		default:
			panic(fmt.Sprintf("cat: %T", p))
		}
	}
	return out
}

// withoutHealth drops publishHealth, which TestMachineHealth checks.
func withoutHealth(effs []effect) []effect {
	return slices.DeleteFunc(slices.Clone(effs), func(e effect) bool { _, is := e.(publishHealth); return is })
}

func expect(t *testing.T, got []effect, want ...effect) {
	t.Helper()
	got = withoutHealth(got)
	for _, e := range slices.Concat(got, want) {
		if c, ok := e.(*startCall); ok {
			c.sentStep = 0 // the step numbers of the calls are checked where they matter, not here
		}
	}
	if reflect.DeepEqual(got, want) {
		return
	}
	var b strings.Builder
	for i := range max(len(got), len(want)) {
		g, w := "-", "-"
		if i < len(got) {
			g = fmt.Sprintf("%T%+v", got[i], got[i])
		}
		if i < len(want) {
			w = fmt.Sprintf("%T%+v", want[i], want[i])
		}
		mark := "  "
		if g != w || (i < len(got) && i < len(want) && !reflect.DeepEqual(got[i], want[i])) {
			mark = "! "
		}
		fmt.Fprintf(&b, "%s%d\n     got  %s\n     want %s\n", mark, i, g, w)
	}
	t.Fatalf("effects differ:\n%s", b.String())
}

// A follower claims a record of another node at observedAt plus its own
// ElectionTimeoutMin at the earliest (case 1), on the record it observed,
// with a term above every term it saw and its own lease.
func TestMachineFollowerClaimsAfterTheTimeout(t *testing.T) {
	r := rec(5, "b", 3, 250*time.Millisecond)
	seen := at(50 * time.Millisecond)
	m := started(t)
	expect(t, m.step(seen, callResult{kind: callRead, sentAt: t0, res: r}),
		cat(observed(seen, snapshot{}, time.Time{}, r),
			newLeader(seen, r),
			&setTimer{t: timerClaim, at: seen.Add(electionTimeout)}, // a fresh random timeout
		)...)

	// The timer fires a nanosecond early (a clock jump, a stale timer):
	// no claim, the timer is armed at the earliest instant allowed.
	expect(t, m.step(seen.Add(300*time.Millisecond-1), timerInput{timerClaim}),
		&setTimer{t: timerClaim, at: seen.Add(300*time.Millisecond - 1).Add(timing.HeartbeatInterval)})
	if m.role != roleFollower || m.writing {
		t.Fatalf("claimed before the timeout: role %v", m.role)
	}

	now := seen.Add(300 * time.Millisecond)
	expect(t, m.step(now, timerInput{timerClaim}), &startCall{
		kind:     callClaim,
		expected: r,
		next:     heartbeat.Record{Election: "e", Leader: "a", Term: 4, Value: []byte("a:1"), Lease: timing.LeaseDuration, Incarnation: testInc},
		sentAt:   now,
		deadline: now.Add(timing.LeaseDuration),
	})
	if m.role != roleCandidate || !m.writing || m.claimTerm != 4 || m.maxTerm != 4 {
		t.Fatalf("after the claim: role %v writing %v claimTerm %d maxTerm %d", m.role, m.writing, m.claimTerm, m.maxTerm)
	}
	// A second firing while the claim is in flight sends nothing.
	expect(t, m.step(now.Add(time.Millisecond), timerInput{timerClaim}))
}

// The term of a claim is above the highest term ever observed, not only
// the current record's.
func TestMachineClaimTermAboveEveryTermSeen(t *testing.T) {
	m := follower(t, rec(5, "b", 9, 0), at(time.Millisecond))
	m.step(at(2*time.Millisecond), notificationInput{n: backend.Notification{Type: backend.RecordChanged, Record: rec(6, "c", 2, 0)}, ok: true})
	now := at(2*time.Millisecond + 300*time.Millisecond)
	effs := m.step(now, timerInput{timerClaim})
	if len(effs) != 1 || effs[0].(*startCall).next.Term != 10 || effs[0].(*startCall).expected.Revision != 6 {
		t.Fatalf("claim: %+v, want term 10 on revision 6", effs)
	}
}

// Mixed timings: a record written with a longer lease than this node's
// delays the claim to FollowerWait(lease) after it was observed, whatever
// this node's own ElectionTimeoutMin.
func TestMachineLongerLeaseInTheRecordDelaysTheClaim(t *testing.T) {
	lease := time.Second
	wait := heartbeat.FollowerWait(lease) // 1.111111112 s
	r := rec(5, "b", 3, lease)
	seen := at(50 * time.Millisecond)
	m := started(t)
	expect(t, m.step(seen, callResult{kind: callRead, sentAt: t0, res: r}),
		cat(observed(seen, snapshot{}, time.Time{}, r),
			newLeader(seen, r),
			// the random part of the timeout, moved later as a whole
			&setTimer{t: timerClaim, at: seen.Add(electionTimeout + wait - timing.ElectionTimeoutMin)},
		)...)

	// At this node's own timeout, and just before the record's lease
	// could have ended, no claim.
	for _, d := range []time.Duration{timing.ElectionTimeoutMin, wait - 1} {
		now := seen.Add(d)
		expect(t, m.step(now, timerInput{timerClaim}), &setTimer{t: timerClaim, at: maxTime(now.Add(timing.HeartbeatInterval), seen.Add(wait))})
	}
	now := seen.Add(wait)
	effs := m.step(now, timerInput{timerClaim})
	if len(effs) != 1 || effs[0].(*startCall).kind != callClaim || effs[0].(*startCall).sentAt != now {
		t.Fatalf("no claim at FollowerWait(lease): %+v", effs)
	}
	// The lease of a record deleted afterwards still counts.
	m2 := follower(t, r, seen)
	m2.step(seen.Add(time.Millisecond), notificationInput{n: backend.Notification{Type: backend.RecordDeleted}, ok: true})
	if m2.claimableAtOnce() || m2.claimDue(seen.Add(time.Millisecond+wait-1)) || !m2.claimDue(seen.Add(time.Millisecond+wait)) {
		t.Fatal("a deleted record's lease is not honoured")
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// A claim answered within its lease makes the node leader: the lease is
// counted from the claim's send time, EventElected is stamped at the reply,
// the renewal is due a heartbeat after the send.
func TestMachineClaimWonWithinTheLease(t *testing.T) {
	m, c, sent := claiming(t)
	res := c.next
	res.Revision = 1
	now := at(20 * time.Millisecond)
	effs := m.step(now, callResult{kind: callClaim, expected: c.expected, next: c.next, sentAt: sent, res: res})
	lctx := m.leaderCtx
	end := sent.Add(timing.LeaseDuration)
	snap := snapshot{leader: true, term: 1, leaderCtx: lctx, record: heartbeat.Record{Election: "e"}, seen: true}
	expect(t, effs, cat(
		stopTimer{timerClaim},
		&armLease{ctx: lctx, end: end},
		&publish{snap: snap, leaseEnd: end},
		&emit{ev: Event{Type: EventElected, At: now, Term: 1, Record: res, LeaderCtx: lctx}},
		observed(now, snap, end, res),
		newLeader(now, res),
		&setTimer{t: timerRenew, at: sent.Add(timing.HeartbeatInterval), align: true},
	)...)
	if m.role != roleLeader || m.leaseEnd != end || m.myRev != 1 {
		t.Fatalf("role %v leaseEnd %v myRev %d", m.role, m.leaseEnd, m.myRev)
	}
}

// A claim whose reply comes when its lease is over gives no leadership:
// the record is this node's own and nobody leads on it, so it is claimed
// again a heartbeat after the first claim (case 3), not after a timeout.
func TestMachineClaimReplyAfterTheLease(t *testing.T) {
	m, c, sent := claiming(t)
	res := c.next
	res.Revision = 1
	now := sent.Add(timing.LeaseDuration) // not before the lease's end
	effs := m.step(now, callResult{kind: callClaim, expected: c.expected, next: c.next, sentAt: sent, res: res})
	snap := snapshot{record: heartbeat.Record{Election: "e"}, seen: true}
	again := sent.Add(timing.HeartbeatInterval) // passed: at once
	expect(t, effs, cat(
		&emit{ev: Event{Type: EventError, Err: fmt.Errorf("leaderfeed: claim of term %d took %v, longer than the lease: %w", 1, timing.LeaseDuration, errLeaseOver)}},
		observed(now, snap, time.Time{}, res),
		newLeader(now, res),
		&setTimer{t: timerClaim, at: maxTime(now, again)}, // observe
		&setTimer{t: timerClaim, at: maxTime(now, again)}, // afterWrite
	)...)
	if m.role != roleFollower || m.leaderCtx != nil {
		t.Fatalf("role %v after a late claim", m.role)
	}
	c2 := m.step(now, timerInput{timerClaim})[0].(*startCall)
	if c2.kind != callClaim || c2.expected.Revision != 1 || c2.next.Term != 2 {
		t.Fatalf("the late claim's record is not claimed again at once: %+v", c2)
	}
}

// A renewal refused with a conflict carrying another node's record ends
// leadership: the leader context is cancelled first, then EventUnelected,
// then EventNewLeader for the new leader.
func TestMachineDeposedByAConflict(t *testing.T) {
	m, _ := leader(t)
	lctx, end := m.leaderCtx, m.leaseEnd
	sent := at(110 * time.Millisecond)
	c := m.step(sent, timerInput{timerRenew})[0].(*startCall)
	if c.kind != callRenew || !reflect.DeepEqual(c.expected, heartbeat.Record{Revision: 1, Leader: "a", Term: 1}) || c.deadline != end {
		t.Fatalf("renewal: %+v", c)
	}
	foreign := rec(2, "b", 2, time.Second)
	err := backend.NewConflict(foreign)
	now := at(120 * time.Millisecond)
	effs := m.step(now, callResult{kind: callRenew, expected: c.expected, next: c.next, sentAt: sent, err: err})
	snap := snapshot{leader: false, term: 1, leaderCtx: lctx, record: rec(1, "a", 1, timing.LeaseDuration), seen: true}
	snap.record.Value, snap.record.Incarnation = []byte("a:1"), testInc
	wait := heartbeat.FollowerWait(time.Second)
	expect(t, effs, cat(
		cancelLeader{ctx: lctx, cause: ErrDeposed},
		stopTimer{timerLease},
		stopTimer{timerRenew},
		&publish{snap: snap, leaseEnd: end},
		&emit{ev: Event{Type: EventUnelected, Term: 1, Reason: ReasonDeposed, Err: err}, notAfter: end},
		observed(now, snap, end, foreign),
		newLeader(now, foreign),
		&setTimer{t: timerClaim, at: now.Add(electionTimeout + wait - timing.ElectionTimeoutMin)}, // observe
		&setTimer{t: timerClaim, at: now.Add(wait)},                                               // afterWrite
	)...)
}

// A record of another node on the feed deposes the leader the same way:
// nothing about leadership is reported before the cancellation.
func TestMachineDeposedByTheFeed(t *testing.T) {
	m, _ := leader(t)
	lctx := m.leaderCtx
	foreign := rec(2, "b", 2, 0)
	effs := m.step(at(30*time.Millisecond), notificationInput{n: backend.Notification{Type: backend.RecordChanged, Record: foreign}, ok: true})
	var kinds []string
	for _, e := range effs {
		switch e := e.(type) {
		case cancelLeader:
			if e.ctx != lctx || e.cause != ErrDeposed {
				t.Fatalf("cancelLeader %+v", e)
			}
			kinds = append(kinds, "cancel")
		case *emit:
			kinds = append(kinds, e.ev.Type.String())
		case *publish:
			kinds = append(kinds, fmt.Sprintf("publish(leader=%v)", e.snap.leader))
		case *setTimer:
			kinds = append(kinds, "set-"+e.t.String())
		case stopTimer:
			kinds = append(kinds, "stop-"+e.t.String())
		}
	}
	// The record is published for Leader() before the step-down, as
	// before the machine existed; the leader context is cancelled before
	// anything else about leadership.
	want := "publish(leader=true) cancel stop-lease stop-renew publish(leader=false) unelected new-leader set-claim"
	if got := strings.Join(kinds, " "); got != want {
		t.Fatalf("effects:\n got  %s\n want %s", got, want)
	}
}

// A renewal answered within its lease asks the driver to extend the leader
// context; once it did, the lease runs from the renewal's send time. If
// the context refused (the lease ended meanwhile), leadership ends with
// ReasonLeaseExpired at the lease's end.
func TestMachineRenewal(t *testing.T) {
	for _, extended := range []bool{true, false} {
		t.Run(fmt.Sprint("extended=", extended), func(t *testing.T) {
			m, _ := leader(t)
			lctx, oldEnd := m.leaderCtx, m.leaseEnd
			proclaim := make(chan error, 1)
			sent := at(40 * time.Millisecond)
			c := m.step(sent, requestInput{r: request{kind: reqProclaim, value: []byte("a:2"), reply: proclaim}})[0].(*startCall)
			if c.next.Value == nil || string(c.next.Value) != "a:2" {
				t.Fatalf("proclaim's renewal: %+v", c)
			}
			res := c.next
			res.Revision = 2
			r := callResult{kind: callRenew, expected: c.expected, next: c.next, sentAt: sent, res: res}
			now := at(50 * time.Millisecond)
			newEnd := sent.Add(timing.LeaseDuration)
			expect(t, m.step(now, r), &extendLease{ctx: lctx, end: newEnd})

			effs := m.step(now, leaseExtendedInput{ok: extended})
			snap := snapshot{leader: true, term: 1, leaderCtx: lctx, record: rec(1, "a", 1, timing.LeaseDuration), seen: true}
			snap.record.Value, snap.record.Incarnation = []byte("a:1"), testInc
			if extended {
				expect(t, effs, cat(
					&armLease{ctx: lctx, end: newEnd},
					&publish{snap: snap, leaseEnd: newEnd},
					logDebug{msg: "leaderfeed: renewed", args: []any{"term", uint64(1), "revision", uint64(2)}},
					reply{to: proclaim, err: nil},
					observed(now, snap, newEnd, res),
					newLeader(now, res),
					&setTimer{t: timerRenew, at: sent.Add(timing.HeartbeatInterval), align: true},
				)...)
				return
			}
			snap.leader = false
			expect(t, effs, cat(
				cancelLeader{ctx: lctx, cause: ErrLeaseExpired},
				stopTimer{timerLease},
				stopTimer{timerRenew},
				&publish{snap: snap, leaseEnd: oldEnd},
				reply{to: proclaim, err: ErrNotLeader},
				&emit{ev: Event{Type: EventUnelected, At: oldEnd, Term: 1, Reason: ReasonLeaseExpired, Err: errLeaseOver}, notAfter: oldEnd},
				observed(now, snap, oldEnd, res),
				newLeader(now, res),
				// the record is its own and it does not lead on it: case 3
				// a heartbeat after its last claim (sent at 10 ms)
				&setTimer{t: timerClaim, at: at(10*time.Millisecond + timing.HeartbeatInterval)},
				&setTimer{t: timerClaim, at: now.Add(timing.HeartbeatInterval)}, // afterWrite
			)...)
		})
	}
}

// A renewal answered after the lease ended is not offered to the lease
// context at all.
func TestMachineRenewalAfterTheLease(t *testing.T) {
	m, _ := leader(t)
	lctx, end := m.leaderCtx, m.leaseEnd
	sent := at(110 * time.Millisecond)
	c := m.step(sent, timerInput{timerRenew})[0].(*startCall)
	res := c.next
	res.Revision = 2
	effs := m.step(sent.Add(timing.LeaseDuration), callResult{kind: callRenew, expected: c.expected, next: c.next, sentAt: sent, res: res})
	if len(effs) == 0 || effs[0] != (cancelLeader{ctx: lctx, cause: ErrLeaseExpired}) {
		t.Fatalf("first effect %+v, want the leader context cancelled", effs)
	}
	for _, e := range effs {
		if _, ok := e.(*extendLease); ok {
			t.Fatal("a late renewal was offered to the lease context")
		}
		if e, ok := e.(*emit); ok && e.ev.Type == EventUnelected && (e.ev.At != end || e.ev.Reason != ReasonLeaseExpired) {
			t.Fatalf("unelected %+v, want at the lease's end %v", e.ev, end)
		}
	}
}

// A renewal refused with a conflict carrying this node's own record at a
// newer revision (an earlier renewal committed, its reply lost) is no
// takeover: the node renews at once on that revision.
func TestMachineRenewalReplyLost(t *testing.T) {
	m, _ := leader(t)
	sent := at(110 * time.Millisecond)
	c := m.step(sent, timerInput{timerRenew})[0].(*startCall)
	mine := rec(3, "a", 1, timing.LeaseDuration)
	now := at(120 * time.Millisecond)
	expect(t, m.step(now, callResult{kind: callRenew, expected: c.expected, next: c.next, sentAt: sent, err: backend.NewConflict(mine)}),
		&startCall{kind: callRenew, expected: heartbeat.Record{Revision: 3, Leader: "a", Term: 1}, next: c.next, sentAt: now, deadline: m.leaseEnd})
	if m.role != roleLeader {
		t.Fatalf("role %v", m.role)
	}
}

// The lease timer's signal steps down only if the current leader context
// has ended (it may be of an earlier term, or of a lease since extended).
func TestMachineLeaseLost(t *testing.T) {
	m, _ := leader(t)
	now := at(300 * time.Millisecond)
	expect(t, m.step(now, leaseLostInput{expired: false}))
	lctx, end := m.leaderCtx, m.leaseEnd
	effs := m.step(now, leaseLostInput{expired: true})
	if len(effs) < 5 || effs[0] != (cancelLeader{ctx: lctx, cause: ErrLeaseExpired}) {
		t.Fatalf("effects %+v", effs)
	}
	if e := effs[4].(*emit); e.ev.Type != EventUnelected || e.ev.At != end || e.ev.Reason != ReasonLeaseExpired {
		t.Fatalf("event %+v", e.ev)
	}
	if m.role != roleFollower {
		t.Fatalf("role %v", m.role)
	}
	expect(t, m.step(now, leaseLostInput{expired: true})) // a second signal: nothing
}

// Resign: leader context first, then EventUnelected, then the vacancy on
// the newest revision this node wrote. A vacancy whose reply was lost comes
// back as a conflict carrying it: the handover is done, Resign gets nil,
// and the node does not claim the vacancy it made (it waits a full
// timeout).
func TestMachineResignVacancyReplyLost(t *testing.T) {
	m, _ := leader(t)
	lctx, end := m.leaderCtx, m.leaseEnd
	ctx := context.Background()
	done := make(chan error, 1)
	now := at(50 * time.Millisecond)
	effs := m.step(now, requestInput{r: request{kind: reqResign, ctx: ctx, reply: done}})
	snap := snapshot{leader: false, term: 1, leaderCtx: lctx, record: rec(1, "a", 1, timing.LeaseDuration), seen: true}
	snap.record.Value, snap.record.Incarnation = []byte("a:1"), testInc
	vac := &startCall{kind: callVacancy, expected: heartbeat.Record{Revision: 1, Leader: "a", Term: 1}, next: heartbeat.Record{Election: "e", Term: 1}, sentAt: now, parent: ctx}
	expect(t, effs,
		cancelLeader{ctx: lctx, cause: ErrResigned},
		stopTimer{timerLease},
		stopTimer{timerRenew},
		&publish{snap: snap, leaseEnd: end},
		&emit{ev: Event{Type: EventUnelected, Term: 1, Reason: ReasonResigned}, notAfter: end},
		vac,
	)
	vacant := rec(2, "", 1, 0)
	later := at(60 * time.Millisecond)
	expect(t, m.step(later, callResult{kind: callVacancy, expected: vac.expected, next: vac.next, sentAt: now, parent: ctx, err: backend.NewConflict(vacant)}), cat(
		observed(later, snap, end, vacant),
		newLeader(later, vacant),
		&setTimer{t: timerClaim, at: later.Add(electionTimeout)}, // observe: its own vacancy is not claimable at once
		reply{to: done, err: nil},
		&setTimer{t: timerClaim, at: later.Add(timing.ElectionTimeoutMin)}, // endVacancy
		&setTimer{t: timerClaim, at: later.Add(timing.ElectionTimeoutMin)}, // afterWrite
	)...)
	if m.vacancy != nil || m.writing || m.claimDue(later.Add(timing.ElectionTimeoutMin-1)) {
		t.Fatal("the resigner may claim its own vacancy at once")
	}
}

// A vacancy of another node is claimed after the jitter, not a timeout
// (case 2).
func TestMachineVacancyOfAnotherNodeIsClaimedAtOnce(t *testing.T) {
	vacant := rec(7, "", 4, 0)
	seen := at(50 * time.Millisecond)
	m := started(t)
	expect(t, m.step(seen, callResult{kind: callRead, sentAt: t0, res: vacant}), cat(
		observed(seen, snapshot{}, time.Time{}, vacant),
		newLeader(seen, vacant),
		&setTimer{t: timerClaim, at: seen.Add(jitter)},
	)...)
	c := m.step(seen.Add(jitter), timerInput{timerClaim})[0].(*startCall)
	if c.kind != callClaim || c.expected.Revision != 7 || c.next.Term != 5 {
		t.Fatalf("claim %+v", c)
	}
}

// A Resign whose context has ended before the vacancy could be sent: the
// driver answers vacancyAborted, Resign gets the error, no write is in
// flight.
func TestMachineResignVacancyAborted(t *testing.T) {
	m, _ := leader(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	done := make(chan error, 1)
	now := at(50 * time.Millisecond)
	effs := m.step(now, requestInput{r: request{kind: reqResign, ctx: ctx, reply: done}})
	if c, ok := effs[len(effs)-1].(*startCall); !ok || c.kind != callVacancy || c.parent != ctx {
		t.Fatalf("last effect %+v, want the vacancy", effs[len(effs)-1])
	}
	expect(t, m.step(now, vacancyAbortedInput{err: context.Canceled}),
		reply{to: done, err: fmt.Errorf("leaderfeed: vacant record not written: %w", context.Canceled)},
		// its own record of the term it gave up: a whole timeout after it
		// was observed (the claim's reply, at 20 ms)
		&setTimer{t: timerClaim, at: at(20*time.Millisecond + timing.ElectionTimeoutMin)},
	)
	if m.writing || m.vacancy != nil {
		t.Fatal("a write is still counted in flight")
	}
}

// A vacancy write that failed is sent again while its context allows;
// once the context has ended (or five attempts), Resign gets the error.
func TestMachineVacancyRetried(t *testing.T) {
	m, _ := leader(t)
	ctx := context.Background()
	done := make(chan error, 1)
	now := at(50 * time.Millisecond)
	effs := m.step(now, requestInput{r: request{kind: reqResign, ctx: ctx, reply: done}})
	vac := effs[len(effs)-1].(*startCall)
	boom := errors.New("boom")
	later := at(60 * time.Millisecond)
	again := vac
	again.sentAt = later
	expect(t, m.step(later, callResult{kind: callVacancy, expected: vac.expected, next: vac.next, sentAt: now, parent: ctx, err: boom}), again)
	expect(t, m.step(later, callResult{kind: callVacancy, expected: vac.expected, next: vac.next, sentAt: later, parent: ctx, err: boom, parentDone: true}),
		reply{to: done, err: fmt.Errorf("leaderfeed: vacant record not written (the others take over after their election timeout): %w", boom)},
		&setTimer{t: timerClaim, at: at(20*time.Millisecond + timing.ElectionTimeoutMin)},
		&setTimer{t: timerClaim, at: at(20*time.Millisecond + timing.ElectionTimeoutMin)},
	)
}

// Stop while a renewal is in flight, whose write commits: the leader
// context is cancelled at once, and the vacancy waits for the renewal and
// is written on the revision the renewal made (not the stale one).
func TestMachineStopWhileRenewing(t *testing.T) {
	m, _ := leader(t)
	lctx := m.leaderCtx
	sent := at(110 * time.Millisecond)
	c := m.step(sent, timerInput{timerRenew})[0].(*startCall)
	stopCtx := context.Background()
	effs := m.step(at(115*time.Millisecond), stopInput{ctx: stopCtx})
	if effs[0] != (cancelLeader{ctx: lctx, cause: ErrStopped}) {
		t.Fatalf("first effect %+v", effs[0])
	}
	for _, e := range effs {
		if c, ok := e.(*startCall); ok {
			t.Fatalf("a write was sent while one is in flight: %+v", c)
		}
	}
	if m.role != roleStopping || m.done() {
		t.Fatalf("role %v done %v", m.role, m.done())
	}
	res := c.next
	res.Revision = 2
	now := at(120 * time.Millisecond)
	effs = m.step(now, callResult{kind: callRenew, expected: c.expected, next: c.next, sentAt: sent, res: res})
	want := &startCall{kind: callVacancy, expected: heartbeat.Record{Revision: 2, Leader: "a", Term: 1}, next: heartbeat.Record{Election: "e", Term: 1}, sentAt: now, sentStep: m.steps, parent: stopCtx}
	if got := effs[len(effs)-1]; !reflect.DeepEqual(got, want) {
		t.Fatalf("last effect %+v, want %+v", got, want)
	}
	vacant := rec(3, "", 1, 0)
	m.step(now, callResult{kind: callVacancy, expected: want.expected, next: want.next, sentAt: now, parent: stopCtx, res: vacant})
	if !m.done() {
		t.Fatal("not done after the vacancy")
	}
}

// Stop while a claim is in flight that wins: the node hands over at once
// with a vacancy bounded by Stop's context, and never reports leading.
func TestMachineStopWhileClaiming(t *testing.T) {
	m, c, sent := claiming(t)
	stopCtx := context.Background()
	expect(t, m.step(at(12*time.Millisecond), stopInput{ctx: stopCtx}),
		stopTimer{timerClaim}, stopTimer{timerPoll}, stopTimer{timerReopen})
	if m.done() {
		t.Fatal("done with a claim in flight")
	}
	res := c.next
	res.Revision = 1
	now := at(20 * time.Millisecond)
	effs := m.step(now, callResult{kind: callClaim, expected: c.expected, next: c.next, sentAt: sent, res: res})
	snap := snapshot{record: heartbeat.Record{Election: "e"}, seen: true}
	vac := &startCall{kind: callVacancy, expected: heartbeat.Record{Revision: 1, Leader: "a", Term: 1}, next: heartbeat.Record{Election: "e", Term: 1}, sentAt: now, parent: stopCtx}
	expect(t, effs, cat(
		observed(now, snap, time.Time{}, res),
		newLeader(now, res),
		stopTimer{timerClaim}, // armClaim: stopping
		vac,
	)...)
	vacant := rec(2, "", 1, 0)
	m.step(now, callResult{kind: callVacancy, expected: vac.expected, next: vac.next, sentAt: now, parent: stopCtx, res: vacant})
	if !m.done() || m.leaderCtx != nil {
		t.Fatalf("done %v leaderCtx %v", m.done(), m.leaderCtx)
	}
}

// The feed brings this node's claim before the claim's reply: the new
// leader is announced after EventElected, not before.
func TestMachineOwnClaimOnTheFeedFirst(t *testing.T) {
	m, c, sent := claiming(t)
	res := c.next
	res.Revision = 1
	for _, e := range m.step(at(15*time.Millisecond), notificationInput{n: backend.Notification{Type: backend.RecordChanged, Record: res}, ok: true}) {
		if e, ok := e.(*emit); ok {
			t.Fatalf("event %v before the claim's reply", e.ev.Type)
		}
	}
	var types []string
	for _, e := range m.step(at(20*time.Millisecond), callResult{kind: callClaim, expected: c.expected, next: c.next, sentAt: sent, res: res}) {
		if e, ok := e.(*emit); ok {
			types = append(types, e.ev.Type.String())
		}
	}
	if got := strings.Join(types, " "); got != "elected new-leader" {
		t.Fatalf("events %q, want elected then new-leader", got)
	}
}

// The changefeed: opened once at a time; a failure closes it, reports it,
// reopens it with backoff and polls meanwhile; when it opens again the
// polling stops and the record is read.
func TestMachineFeedDownAndUp(t *testing.T) {
	m := follower(t, rec(5, "b", 3, 0), at(time.Millisecond))
	now := at(2 * time.Millisecond)
	expect(t, m.step(now, subscribedInput{ok: true}),
		useFeed{}, stopTimer{timerPoll}, &emit{ev: Event{Type: EventSubscribeStarted}},
		&startCall{kind: callRead, sentAt: now, deadline: now.Add(timing.ElectionTimeoutMin)})
	expect(t, m.step(now, timerInput{timerReopen})) // up: nothing to reopen
	boom := errors.New("boom")
	later := at(10 * time.Millisecond)
	backoff := timing.HeartbeatInterval / 20
	expect(t, m.step(later, notificationInput{n: backend.Notification{Type: backend.Failed, Err: boom}, ok: true}),
		closeFeed{}, &emit{ev: Event{Type: EventSubscribeError, Err: boom}},
		&setTimer{t: timerReopen, at: later.Add(backoff + backoff/4)}, // jitter: half of backoff/2
		&setTimer{t: timerPoll, at: later.Add(timing.HeartbeatInterval)})
	// The poll while down: a read is in flight already, so once more after it.
	expect(t, m.step(later.Add(timing.HeartbeatInterval), timerInput{timerPoll}),
		&setTimer{t: timerPoll, at: later.Add(2 * timing.HeartbeatInterval)})
	if !m.readAgain {
		t.Fatal("the poll's read is not queued behind the read in flight")
	}
	expect(t, m.step(later.Add(backoff+backoff/4), timerInput{timerReopen}), openFeed{})
	expect(t, m.step(later.Add(backoff+backoff/4), timerInput{timerReopen})) // opening: once
}

// Stop while Subscribe is in flight: its channel is discarded when it
// comes.
func TestMachineSubscribedWhileStopping(t *testing.T) {
	m := follower(t, rec(5, "b", 3, 0), at(time.Millisecond))
	m.step(at(2*time.Millisecond), stopInput{ctx: context.Background()})
	if !m.done() {
		t.Fatal("a follower with no write in flight is not done after Stop")
	}
	expect(t, m.step(at(3*time.Millisecond), subscribedInput{ok: true}), discardFeed{})
}

// exit while leading (Stop's context ended first): the leader context is
// cancelled first, a waiting Resign gets ErrClosed, timers and feed stop.
func TestMachineExit(t *testing.T) {
	m, _ := leader(t)
	lctx := m.leaderCtx
	effs := m.step(at(30*time.Millisecond), exitInput{})
	if effs[0] != (cancelLeader{ctx: lctx, cause: ErrStopped}) {
		t.Fatalf("first effect %+v", effs[0])
	}
	n := len(effs)
	expect(t, effs[n-5:], stopTimer{timerClaim}, stopTimer{timerRenew}, stopTimer{timerReopen}, stopTimer{timerPoll}, closeFeed{})
}

// A claim whose reply was lost after it committed: the feed brings this
// node's own record of the term it claimed. It does not lead on it (no
// reply came within the lease), so it claims it again (case 3) a heartbeat
// after the first claim, with a new term, on the committed revision.
func TestMachineClaimReplyLost(t *testing.T) {
	m, c, sent := claiming(t)
	mine := c.next
	mine.Revision = 1
	now := at(30 * time.Millisecond)
	lost := errors.New("reply lost")
	expect(t, m.step(now, callResult{kind: callClaim, expected: c.expected, next: c.next, sentAt: sent, err: lost}),
		&emit{ev: Event{Type: EventError, Err: fmt.Errorf("leaderfeed: claim term %d: %w", 1, lost)}},
		// afterWrite: the store had no record when last seen
		&setTimer{t: timerClaim, at: now.Add(jitter + timing.HeartbeatInterval)},
	)
	later := at(40 * time.Millisecond)
	snap := snapshot{record: heartbeat.Record{Election: "e"}, seen: true}
	expect(t, m.step(later, notificationInput{n: backend.Notification{Type: backend.RecordChanged, Record: mine}, ok: true}), cat(
		observed(later, snap, time.Time{}, mine),
		newLeader(later, mine),
		&setTimer{t: timerClaim, at: sent.Add(timing.HeartbeatInterval)}, // a heartbeat after the last claim
	)...)
	c2 := m.step(sent.Add(timing.HeartbeatInterval), timerInput{timerClaim})[0].(*startCall)
	if c2.kind != callClaim || c2.next.Term != 2 || !c2.expected.SameWrite(mine) {
		t.Fatalf("retry %+v, want term 2 on the committed claim", c2)
	}
}

// A Proclaim made while a renewal is in flight is answered by the next
// renewal, which carries its value, not by the one in flight.
func TestMachineProclaimDuringRenewal(t *testing.T) {
	m, _ := leader(t)
	lctx := m.leaderCtx
	sent := at(110 * time.Millisecond)
	c := m.step(sent, timerInput{timerRenew})[0].(*startCall)
	proclaim := make(chan error, 1)
	expect(t, m.step(at(112*time.Millisecond), requestInput{r: request{kind: reqProclaim, value: []byte("a:2"), reply: proclaim}}))
	res := c.next
	res.Revision = 2
	r := callResult{kind: callRenew, expected: c.expected, next: c.next, sentAt: sent, res: res}
	now := at(120 * time.Millisecond)
	expect(t, m.step(now, r), &extendLease{ctx: lctx, end: sent.Add(timing.LeaseDuration)})
	effs := withoutHealth(m.step(now, leaseExtendedInput{ok: true}))
	for _, e := range effs {
		if _, ok := e.(reply); ok {
			t.Fatalf("the renewal sent before Proclaim answered it: %+v", effs)
		}
	}
	c2, ok := effs[len(effs)-1].(*startCall)
	if !ok || c2.kind != callRenew || string(c2.next.Value) != "a:2" || c2.expected.Revision != 2 {
		t.Fatalf("last effect %+v, want a renewal carrying the new value on revision 2", effs[len(effs)-1])
	}
	// A transient failure of that renewal keeps the Proclaim waiting for
	// the retry; the retry's success answers it.
	r2 := callResult{kind: callRenew, expected: c2.expected, next: c2.next, sentAt: now, err: errors.New("boom")}
	for _, e := range m.step(at(125*time.Millisecond), r2) {
		if _, ok := e.(reply); ok {
			t.Fatal("a failed renewal answered the Proclaim")
		}
	}
	retry := at(145 * time.Millisecond)
	c3 := m.step(retry, timerInput{timerRenew})[0].(*startCall)
	res3 := c3.next
	res3.Revision = 3
	r3 := callResult{kind: callRenew, expected: c3.expected, next: c3.next, sentAt: retry, res: res3}
	m.step(at(150*time.Millisecond), r3)
	var replies []reply
	for _, e := range m.step(at(150*time.Millisecond), leaseExtendedInput{ok: true}) {
		if e, ok := e.(reply); ok {
			replies = append(replies, e)
		}
	}
	if len(replies) != 1 || replies[0] != (reply{to: proclaim}) {
		t.Fatalf("replies %+v, want the Proclaim answered nil", replies)
	}
}

// TransferTo steps down first (EventUnelected with ReasonTransferred, the
// leader context cancelled with ErrTransferred), then writes the vacancy
// reserved for the target with the compare-and-set on its own revision. A
// lost reply (the reserved vacancy comes back as a conflict) is taken as
// its own write: the transfer succeeded.
func TestMachineTransferReservesTheVacancy(t *testing.T) {
	m, _ := leader(t)
	lctx, end := m.leaderCtx, m.leaseEnd
	ctx := context.Background()
	done := make(chan error, 1)
	now := at(50 * time.Millisecond)
	effs := m.step(now, requestInput{r: request{kind: reqTransfer, ctx: ctx, target: "b", reply: done}})
	snap := snapshot{leader: false, term: 1, leaderCtx: lctx, record: rec(1, "a", 1, timing.LeaseDuration), seen: true}
	snap.record.Value, snap.record.Incarnation = []byte("a:1"), testInc
	vac := &startCall{kind: callVacancy, expected: heartbeat.Record{Revision: 1, Leader: "a", Term: 1},
		next: heartbeat.Record{Election: "e", Term: 1, Successor: "b"}, sentAt: now, parent: ctx}
	expect(t, effs,
		cancelLeader{ctx: lctx, cause: ErrTransferred},
		stopTimer{timerLease},
		stopTimer{timerRenew},
		&publish{snap: snap, leaseEnd: end},
		&emit{ev: Event{Type: EventUnelected, Term: 1, Reason: ReasonTransferred}, notAfter: end},
		vac,
	)
	reserved := rec(2, "", 1, 0)
	reserved.Successor = "b"
	later := at(60 * time.Millisecond)
	effs = withoutHealth(m.step(later, callResult{kind: callVacancy, expected: vac.expected, next: vac.next, sentAt: now, parent: ctx, err: backend.NewConflict(reserved)}))
	if r, ok := effs[len(effs)-3].(reply); !ok || r.to != done || r.err != nil {
		t.Fatalf("effects %v: want the transfer answered without error", effs)
	}
	if m.claimDue(later.Add(timing.ElectionTimeoutMin - 1)) {
		t.Fatal("the old leader may claim the vacancy it reserved for another node before its election timeout")
	}
	if !m.claimDue(later.Add(timing.ElectionTimeoutMin)) {
		t.Fatal("the old leader may not claim a reserved vacancy after its election timeout (a dead successor would hold the election)")
	}
}

// A transfer whose vacancy meets another node's record (somebody took
// over first) reports it, matching ErrConflict.
func TestMachineTransferOvertaken(t *testing.T) {
	m, _ := leader(t)
	done := make(chan error, 1)
	now := at(50 * time.Millisecond)
	effs := m.step(now, requestInput{r: request{kind: reqTransfer, ctx: context.Background(), target: "b", reply: done}})
	vac := effs[len(effs)-1].(*startCall)
	effs = m.step(at(60*time.Millisecond), callResult{kind: callVacancy, expected: vac.expected, next: vac.next, sentAt: now, parent: vac.parent, err: backend.NewConflict(rec(2, "c", 2, timing.LeaseDuration))})
	for _, e := range effs {
		if r, ok := e.(reply); ok && r.to == done {
			if !errors.Is(r.err, backend.ErrConflict) {
				t.Fatalf("transfer overtaken: %v, want ErrConflict", r.err)
			}
			return
		}
	}
	t.Fatalf("effects %v: the transfer is not answered", effs)
}

// Bad transfers change nothing: a follower gets ErrNotLeader, a leader
// asked to transfer to itself ErrTransferToSelf, and keeps leading.
func TestMachineTransferRefused(t *testing.T) {
	f := follower(t, rec(3, "x", 2, 0), at(5*time.Millisecond))
	done := make(chan error, 1)
	expect(t, f.step(at(10*time.Millisecond), requestInput{r: request{kind: reqTransfer, target: "b", reply: done}}), reply{to: done, err: ErrNotLeader})
	m, _ := leader(t)
	expect(t, m.step(at(30*time.Millisecond), requestInput{r: request{kind: reqTransfer, target: "a", reply: done}}), reply{to: done, err: ErrTransferToSelf})
	if m.role != roleLeader {
		t.Fatal("a refused transfer ended the term")
	}
}

// The successor claims a vacancy reserved for it at once (case 2); every
// other node waits its election timeout from when it saw it (case 1), as
// for a heartbeat.
func TestMachineReservedVacancy(t *testing.T) {
	reserved := rec(7, "", 4, 0)
	seen := at(50 * time.Millisecond)
	for _, tc := range []struct {
		successor string
		claimAt   time.Time
	}{
		{"a", seen.Add(jitter)},          // this node ("a"): at once
		{"b", seen.Add(electionTimeout)}, // another: the random election timeout
	} {
		reserved.Successor = tc.successor
		m := started(t)
		expect(t, m.step(seen, callResult{kind: callRead, sentAt: t0, res: reserved}), cat(
			observed(seen, snapshot{}, time.Time{}, reserved),
			newLeader(seen, reserved),
			&setTimer{t: timerClaim, at: tc.claimAt},
		)...)
		if tc.successor != "a" {
			// A claim timer that fires early (a node whose own timing is
			// shorter) is re-armed, not sent.
			if effs := m.step(seen.Add(timing.ElectionTimeoutMin-1), timerInput{timerClaim}); len(effs) != 1 || effs[0].(*setTimer).t != timerClaim {
				t.Fatalf("successor %q: claim before the timeout: %v", tc.successor, effs)
			}
		}
		c := m.step(tc.claimAt, timerInput{timerClaim})[0].(*startCall)
		if c.kind != callClaim || c.expected.Revision != 7 || c.next.Term != 5 || c.next.Successor != "" {
			t.Fatalf("successor %q: claim %+v", tc.successor, c)
		}
	}
}

// A claim whose reply was lost, retried before the feed brought its write:
// the retry's conflict carries the earlier claim's record, which names this
// node with a term it claimed. That is its own write, granting no lease but
// its own (case 3): the next claim goes a heartbeat after the last one, not
// an election timeout later.
func TestMachineEarlierClaimInTheConflict(t *testing.T) {
	m, c, sent := claiming(t)
	first := c.next
	first.Revision = 1
	m.step(at(30*time.Millisecond), callResult{kind: callClaim, expected: c.expected, next: c.next, sentAt: sent, err: errors.New("reply lost")})
	retry := at(30*time.Millisecond + jitter + timing.HeartbeatInterval)
	c2 := m.step(retry, timerInput{timerClaim})[0].(*startCall)
	if c2.kind != callClaim || c2.next.Term != 2 || c2.expected.Revision != 0 {
		t.Fatalf("retry %+v, want term 2 on no record", c2)
	}
	now := retry.Add(5 * time.Millisecond)
	effs := m.step(now, callResult{kind: callClaim, expected: c2.expected, next: c2.next, sentAt: retry, err: &backend.ConflictError{Current: first}})
	var armed []setTimer
	for _, e := range effs {
		if st, ok := e.(*setTimer); ok && st.t == timerClaim {
			armed = append(armed, *st)
		}
	}
	// The last arming counts: a heartbeat after the failed attempt (an
	// election timeout, 300 ms or more after the record was seen, before).
	if want := now.Add(timing.HeartbeatInterval); len(armed) == 0 || !armed[len(armed)-1].at.Equal(want) {
		t.Fatalf("claim timer %v, want last at %v (a heartbeat after the failed attempt); effects %v", armed, want, effs)
	}
	c3 := m.step(now.Add(timing.HeartbeatInterval), timerInput{timerClaim})[0].(*startCall)
	if c3.kind != callClaim || c3.next.Term != 3 || !c3.expected.SameWrite(first) {
		t.Fatalf("third claim %+v, want term 3 on the first claim's record", c3)
	}
}

// The Priority check runs in the machine: the presence timer asks for a
// refresh (and, while leading, a read of the participants), one at a time;
// a higher-priority participant seen live at every check for
// PriorityHysteresis of the term is handed the election, with a vacancy
// bounded by a presence interval; a failed read restarts the count.
func TestMachinePriorityCheckTransfers(t *testing.T) {
	m, _ := leader(t) // term 1, lease until 260ms
	m.pres = newPriorityCheck(Options{Participate: true, PresenceInterval: 50 * time.Millisecond,
		PresenceTTL: 150 * time.Millisecond, PriorityHysteresis: 100 * time.Millisecond})
	expect(t, m.step(at(50*time.Millisecond), timerInput{timerPresence}),
		&setTimer{t: timerPresence, at: at(100 * time.Millisecond)},
		presenceCall{term: 1, check: true, token: m.pres.sent[0].token, value: []byte("a:1")},
	)
	if tok := m.pres.sent[0].token; tok == 0 || tok > heartbeat.MaxToken {
		t.Fatalf("presence token %d, want one in [1, MaxToken]", tok)
	}
	expect(t, m.step(at(55*time.Millisecond), timerInput{timerPresence}),
		&setTimer{t: timerPresence, at: at(105 * time.Millisecond)}) // one call at a time

	store := at(time.Hour) // the store's clock is its own
	live := func(node string, prio int, canLead bool) backend.Presence {
		return backend.Presence{Node: node, Priority: prio, CanLead: canLead, Timestamp: store.Add(-10 * time.Millisecond)}
	}
	ps := []backend.Presence{
		live("a", 0, true), live("c", 0, true), live("d", 9, false), live("b", 5, true),
		{Node: "e", Priority: 9, CanLead: true, Timestamp: store.Add(-time.Second)}, // expired
	}
	result := func(when time.Duration, readErr error) []effect {
		m.pres.busy = true
		return m.step(at(when), presenceResult{term: 1, check: true, ps: ps, storeNow: store, readErr: readErr})
	}
	expect(t, result(60*time.Millisecond, nil))  // b first seen
	expect(t, result(110*time.Millisecond, nil)) // 50ms < hysteresis
	readErr := errors.New("read failed")
	expect(t, result(120*time.Millisecond, readErr),
		logDebug{msg: "leaderfeed: participants not read", args: []any{"err", readErr}})
	expect(t, result(130*time.Millisecond, nil)) // b seen again from 130ms
	expect(t, result(200*time.Millisecond, nil)) // 70ms
	if m.role != roleLeader {
		t.Fatalf("handed over before the hysteresis: role %v", m.role)
	}
	expect(t, m.step(at(225*time.Millisecond), presenceResult{term: 7, check: true, ps: ps, storeNow: store})) // another term's

	effs := result(230*time.Millisecond, nil)
	if m.role != roleFollower || m.vacancy == nil || m.vacancy.successor != "b" {
		t.Fatalf("after the hysteresis: role %v, vacancy %+v; effects %v", m.role, m.vacancy, effs)
	}
	var vacancy *startCall
	var unelected *Event
	for _, e := range effs {
		switch e := e.(type) {
		case *startCall:
			vacancy = e
		case *emit:
			unelected = &e.ev
		}
	}
	if l, ok := effs[0].(logLine); !ok || l.level != slog.LevelInfo {
		t.Errorf("first effect %v, want the handover logged", effs[0])
	}
	if unelected == nil || unelected.Type != EventUnelected || unelected.Reason != ReasonTransferred {
		t.Errorf("event %+v, want EventUnelected (transferred)", unelected)
	}
	if vacancy == nil || vacancy.kind != callVacancy || vacancy.next.Successor != "b" || vacancy.parent != nil ||
		!vacancy.deadline.Equal(at(280*time.Millisecond)) {
		t.Fatalf("vacancy %+v, want one reserved for b, on the engine's context, due 280ms", vacancy)
	}

	// The vacancy fails five times: logged, not an EventError of Stop.
	err := errors.New("unreachable")
	for i := range 5 {
		effs = withoutHealth(m.step(at(time.Duration(240+i)*time.Millisecond), callResult{kind: callVacancy, expected: vacancy.expected, next: vacancy.next, sentAt: vacancy.sentAt, err: err}))
	}
	if m.vacancy != nil {
		t.Fatalf("vacancy still pending after 5 attempts: %+v", m.vacancy)
	}
	want := logLine{level: slog.LevelInfo, msg: "leaderfeed: priority handover failed", args: []any{"to", "b", "err", fmt.Errorf("leaderfeed: vacant record not written (the others take over after their election timeout): %w", err)}}
	if len(effs) == 0 || !reflect.DeepEqual(effs[0], want) {
		t.Fatalf("after the last attempt: %v, want first %v", effs, want)
	}

	// A follower's results reset the count.
	m.pres.since["b"] = at(0)
	expect(t, result(300*time.Millisecond, nil))
	if len(m.pres.since) != 0 {
		t.Fatalf("a follower keeps %v", m.pres.since)
	}
}

// Stop deletes the presence record, bounded by Stop's context, and stops
// the presence timer.
func TestMachineStopLeavesPresence(t *testing.T) {
	m := newTestMachine(t, Options{Participate: true, PresenceInterval: 50 * time.Millisecond, PresenceTTL: 150 * time.Millisecond})
	effs := withoutHealth(m.step(t0, startInput{}))
	if got := effs[len(effs)-1]; !reflect.DeepEqual(got, &setTimer{t: timerPresence, at: t0.Add(50 * time.Millisecond)}) { // Start wrote it, with a token
		t.Fatalf("start: last effect %v, want the presence timer", got)
	}
	ctx := context.Background()
	effs = m.step(at(10*time.Millisecond), stopInput{ctx: ctx})
	want := []effect{stopTimer{timerPresence}, leavePresence{ctx: ctx, tell: true}}
	if len(effs) < 2 || !reflect.DeepEqual(effs[len(effs)-2:], want) {
		t.Fatalf("stop: %v, want it to end with %v", effs, want)
	}
	expect(t, m.step(at(50*time.Millisecond), timerInput{timerPresence})) // stopping: nothing
}

// Health is the machine's: each step that changes it publishes it
// (publishHealth), and a refused kind of call moves the timer that starts
// it refusalRetry later, inside the machine.
func TestMachineHealth(t *testing.T) {
	m := newTestMachine(t, Options{})
	health := func(effs []effect) Health {
		t.Helper()
		if n := len(effs) - len(withoutHealth(effs)); n != 1 {
			t.Fatalf("effects %v: %d publishHealth, want 1", effs, n)
		}
		return m.health
	}
	if h := health(m.step(t0, startInput{})); h != (Health{Started: t0, LastContact: t0, FeedDownSince: t0}) {
		t.Fatalf("started: %+v", h)
	}
	if h := health(m.step(at(5*time.Millisecond), subscribedInput{ok: true})); !h.LastContact.Equal(at(5*time.Millisecond)) || !h.FeedDownSince.IsZero() {
		t.Fatalf("feed opened: %+v", h)
	}
	down := errors.New("connection reset")
	h := health(m.step(at(10*time.Millisecond), callResult{kind: callRead, sentAt: t0, err: down}))
	if !h.ReadsFailingSince.Equal(at(10*time.Millisecond)) || !h.LastContact.Equal(at(5*time.Millisecond)) {
		t.Fatalf("read failed: %+v", h)
	}

	refused := fmt.Errorf("permission denied: %w", ErrRefused)
	m.reading = true
	effs := m.step(at(20*time.Millisecond), callResult{kind: callRead, sentAt: t0, err: refused})
	h = health(effs)
	if h.Refused != refused || !h.RefusedSince.Equal(at(20*time.Millisecond)) || !h.LastContact.Equal(at(20*time.Millisecond)) ||
		!h.ReadsFailingSince.Equal(at(10*time.Millisecond)) {
		t.Fatalf("read refused: %+v", h)
	}
	if l, ok := effs[0].(logLine); !ok || l.level != slog.LevelError || l.msg != "leaderfeed: store refuses" {
		t.Fatalf("read refused: first effect %v, want the refusal logged at Error", effs[0])
	}
	m.feedUp = false
	effs = withoutHealth(m.step(at(30*time.Millisecond), timerInput{timerPoll}))
	retry := at(20*time.Millisecond + refusalRetry(timing))
	if want := (&setTimer{t: timerPoll, at: retry}); len(effs) != 2 || !reflect.DeepEqual(effs[1], want) {
		t.Fatalf("poll while reads are refused: %v, want the next poll at %v", effs, retry)
	}

	effs = m.step(at(40*time.Millisecond), callResult{kind: callRead, sentAt: at(30 * time.Millisecond), err: backend.ErrNotFound})
	h = health(effs)
	if h.Refused != nil || !h.RefusedSince.IsZero() || !h.ReadsFailingSince.IsZero() || !h.LastContact.Equal(at(40*time.Millisecond)) {
		t.Fatalf("read answered: %+v", h)
	}
	if l, ok := effs[0].(logLine); !ok || l.level != slog.LevelInfo {
		t.Fatalf("read answered: first effect %v, want the end of refusals logged at Info", effs[0])
	}
	if effs := m.step(at(50*time.Millisecond), timerInput{timerClaim}); slices.ContainsFunc(effs, func(e effect) bool { _, is := e.(publishHealth); return is }) {
		t.Fatalf("a claim timer changed no health, yet: %v", effs)
	}
}
