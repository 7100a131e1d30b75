package base

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// participating gives m the presence state of a participant (interval
// 50 ms, TTL 150 ms).
func participating(m *machine) *machine {
	m.pres = newPriorityCheck(Options{Participate: true, PresenceInterval: 50 * time.Millisecond,
		PresenceTTL: 150 * time.Millisecond, PriorityHysteresis: time.Hour})
	return m
}

// presenceToken steps m's presence timer at when and returns the token of
// the presence write it asks for.
func presenceToken(t *testing.T, m *machine, when time.Time) uint64 {
	t.Helper()
	for _, e := range m.step(when, timerInput{timerPresence}) {
		if c, ok := e.(presenceCall); ok {
			if c.token == 0 || c.token > heartbeat.MaxToken {
				t.Fatalf("presence token %d, want one in [1, MaxToken]", c.token)
			}
			return c.token
		}
	}
	t.Fatal("the presence timer asked for no presence write")
	return 0
}

// viewed answers the handoverView among effs, if any, with the
// participants ps read at the store's time storeNow, and returns effs
// with the effects of that answer.
func viewed(m *machine, now time.Time, effs []effect, ps []backend.Presence, storeNow time.Time) []effect {
	for _, e := range effs {
		if _, ok := e.(handoverView); ok {
			return append(effs, m.step(now, handoverViewResult{ps: ps, storeNow: storeNow})...)
		}
	}
	return effs
}

func findCall(effs []effect, kind callKind) *startCall {
	for _, e := range effs {
		if c, ok := e.(*startCall); ok && c.kind == kind {
			return c
		}
	}
	return nil
}

func findEvent(effs []effect, typ EventType) *Event {
	for _, e := range effs {
		if em, ok := e.(*emit); ok && em.ev.Type == typ {
			return &em.ev
		}
	}
	return nil
}

// A leader that read the participants in its term hands over in one
// write on Resign: the record names the live participant of the highest
// priority that can lead and wrote a token, with a new term, its value,
// the writer's lease and that token. It then waits like any follower.
// With no recent read it writes a vacancy, as before.
func TestMachineResignHandsOverInOneWrite(t *testing.T) {
	m, _ := leader(t)
	participating(m)
	store := at(time.Hour)
	ps := []backend.Presence{
		{Node: "a", Priority: 9, CanLead: true, Token: 5, Timestamp: store},
		{Node: "b", Priority: 1, CanLead: true, Token: 77, Value: []byte("b:1"), Timestamp: store},
		{Node: "c", Priority: 5, CanLead: true, Timestamp: store},                     // no token: an older version
		{Node: "d", Priority: 9, Token: 8, Timestamp: store},                          // observe-only
		{Node: "e", Priority: 9, CanLead: true, Token: 9, Timestamp: at(time.Minute)}, // expired
	}
	m.pres.busy = true
	m.step(at(30*time.Millisecond), presenceResult{term: 1, check: true, ps: ps, storeNow: store})
	done := make(chan error, 1)
	now := at(40 * time.Millisecond)
	c := findCall(viewed(m, now, m.step(now, requestInput{r: request{kind: reqResign, ctx: context.Background(), reply: done}}), ps, store), callVacancy)
	want := heartbeat.Record{Election: "e", Leader: "b", Term: 2, Value: []byte("b:1"), Lease: timing.LeaseDuration, Handover: 77}
	if c == nil || !c.next.Equal(want) || !c.expected.SameWrite(rec(1, "a", 1, 0)) {
		t.Fatalf("resign wrote %+v, want %v on revision 1", c, want)
	}
	if m.role != roleFollower {
		t.Fatalf("role %v after the resign, want follower", m.role)
	}
	res := want
	res.Revision = 2
	later := at(45 * time.Millisecond)
	answered := false
	for _, e := range m.step(later, callResult{kind: callVacancy, expected: c.expected, next: c.next, sentAt: now, parent: c.parent, res: res}) {
		if r, ok := e.(reply); ok && r.to == done {
			answered = r.err == nil
		}
	}
	if !answered {
		t.Fatal("the resign is not answered without error")
	}
	if m.claimDue(later.Add(heartbeat.FollowerWait(timing.LeaseDuration) - 1)) {
		t.Fatal("the old leader may claim the record it handed over before the successor's lease ended")
	}

	// A backend without the guarded write: the handover reads the
	// participants first. That read fails: a vacancy for whoever claims
	// first, whatever the last read of the Priority check held (it may
	// name a node that left since).
	m2, _ := leader(t)
	participating(m2)
	m2.noGuard = true
	m2.pres.busy = true
	m2.step(at(30*time.Millisecond), presenceResult{term: 1, check: true, ps: ps, storeNow: store})
	effs := m2.step(at(31*time.Millisecond), requestInput{r: request{kind: reqResign, ctx: context.Background(), reply: done}})
	if findCall(effs, callVacancy) != nil {
		t.Fatal("resign wrote before its read of the participants")
	}
	c = findCall(m2.step(at(32*time.Millisecond), handoverViewResult{err: context.DeadlineExceeded}), callVacancy)
	if c == nil || !c.next.Vacant() || c.next.Handover != 0 || c.next.Successor != "" {
		t.Fatalf("resign with a failed read wrote %+v, want a vacancy for anyone", c)
	}
}

// Issue 41: a leader hands over on a read of the participants made when
// it gives the election up, not on the Priority check's last read: a node
// that withdrew since (its Stop deleted its presence) is never its
// successor. Among those of one priority it picks the one that joined
// most recently: a rolling restart's new node, not an old one stopped
// next. A stopping leader withdraws its own presence in that same step,
// before it writes.
func TestMachineHandsOverOnAFreshView(t *testing.T) {
	store := at(time.Hour)
	old := backend.Presence{Node: "b", CanLead: true, Token: 5, Timestamp: store, Joined: store.Add(-time.Hour)}
	gone := backend.Presence{Node: "c", CanLead: true, Token: 6, Timestamp: store, Joined: store.Add(-time.Minute)}
	newer := backend.Presence{Node: "z", CanLead: true, Token: 7, Timestamp: store, Joined: store.Add(-time.Second)}
	for _, stop := range []bool{false, true} {
		m, _ := leader(t)
		participating(m)
		m.noGuard = true // Resign reads at once on a backend without the guarded write
		m.pres.busy = true
		m.step(at(30*time.Millisecond), presenceResult{term: 1, check: true, ps: []backend.Presence{old, gone}, storeNow: store})
		now := at(40 * time.Millisecond)
		var effs []effect
		if stop {
			effs = m.step(now, stopInput{ctx: context.Background()})
		} else {
			effs = m.step(now, requestInput{r: request{kind: reqResign, ctx: context.Background(), reply: make(chan error, 1)}})
		}
		var view *handoverView
		for _, e := range effs {
			switch e := e.(type) {
			case handoverView:
				view = &e
			case leavePresence:
				t.Fatal("a leader's presence is deleted apart from its handover")
			}
		}
		if view == nil || view.leave != stop || findCall(effs, callVacancy) != nil {
			t.Fatalf("stop %v: effects %v, want a handoverView (leave %v) and no write yet", stop, effs, stop)
		}
		// c left since the last check; z joined after b.
		c := findCall(m.step(now, handoverViewResult{ps: []backend.Presence{old, newer}, storeNow: store}), callVacancy)
		if c == nil || c.next.Leader != "z" || c.next.Handover != 7 {
			t.Fatalf("stop %v: wrote %+v, want the election handed to z, the participant that joined last", stop, c)
		}
	}
}

// The successor leads on a record handed to it from the send of the
// presence write whose token the record carries, for the shorter of its
// lease and the record's, and renews a heartbeat after that send; the
// record is announced after EventElected.
func TestMachineTakesTheHandover(t *testing.T) {
	m := participating(follower(t, rec(3, "x", 2, timing.LeaseDuration), at(5*time.Millisecond)))
	sent := at(10 * time.Millisecond)
	tok := presenceToken(t, m, sent)
	r := rec(4, "a", 3, 200*time.Millisecond)
	r.Handover = tok
	now := at(100 * time.Millisecond)
	effs := m.step(now, notificationInput{n: backend.Notification{Type: backend.RecordChanged, Record: r}, ok: true})
	el := findEvent(effs, EventElected)
	if el == nil || el.Term != 3 || el.LeaderCtx == nil || el.Record.Handover != tok {
		t.Fatalf("effects %v: want EventElected of term 3 with a leader context", effs)
	}
	nl := findEvent(effs, EventNewLeader)
	if nl == nil || nl.Leader != "a" {
		t.Fatalf("effects %v: want the record announced", effs)
	}
	if m.role != roleLeader || m.term != 3 || m.myRev != 4 || !m.leaseEnd.Equal(sent.Add(200*time.Millisecond)) {
		t.Fatalf("role %v term %d rev %d lease to %v; want leading term 3 on 4 until %v", m.role, m.term, m.myRev, m.leaseEnd, sent.Add(200*time.Millisecond))
	}
	var renewAt time.Time
	for _, e := range effs {
		if st, ok := e.(*setTimer); ok && st.t == timerRenew {
			renewAt = st.at
		}
	}
	if !renewAt.Equal(sent.Add(timing.HeartbeatInterval)) {
		t.Fatalf("renewal due %v, want %v", renewAt, sent.Add(timing.HeartbeatInterval))
	}
	rn := findCall(m.step(renewAt, timerInput{timerRenew}), callRenew)
	if rn == nil || !rn.expected.SameWrite(r) || rn.next.Handover != 0 || rn.next.Term != 3 {
		t.Fatalf("renewal %+v, want one on the handed record without a token", rn)
	}
	// Its renewal, once written, is its own write, with or without a
	// lost reply (own).
	rr := rn.next
	rr.Revision = 5
	if !m.own(rr) || !m.own(r) {
		t.Fatal("the handed record or the successor's renewal is not its own")
	}
}

// A handover observed after the lease it grants ended, or one this node
// cannot take (it is stopping), grants no lease to anyone else: it is
// claimed at once with a new term. A handover with a token this process
// did not draw (an earlier process of the same node id) is a heartbeat.
func TestMachineHandoverLateOrForeign(t *testing.T) {
	sent := at(10 * time.Millisecond)
	for _, tc := range []struct {
		name    string
		foreign bool
		gaveUp  bool // this node resigned or transferred a term before
		seen    time.Time
	}{
		{"late", false, false, sent.Add(timing.LeaseDuration)},
		{"late after giving up a term", false, true, sent.Add(timing.LeaseDuration)},
		{"foreign", true, false, at(100 * time.Millisecond)},
	} {
		m := participating(follower(t, rec(3, "x", 2, timing.LeaseDuration), at(5*time.Millisecond)))
		m.handedOver = tc.gaveUp
		tok := presenceToken(t, m, sent)
		r := rec(4, "a", 3, timing.LeaseDuration)
		r.Handover = tok
		if tc.foreign {
			r.Handover = tok ^ 1
		}
		effs := m.step(tc.seen, notificationInput{n: backend.Notification{Type: backend.RecordChanged, Record: r}, ok: true})
		if m.role != roleFollower || findEvent(effs, EventElected) != nil {
			t.Fatalf("%s: role %v, effects %v: want a follower", tc.name, m.role, effs)
		}
		if tc.foreign {
			if m.claimDue(tc.seen.Add(heartbeat.FollowerWait(r.Lease) - 1)) {
				t.Fatalf("%s: claimable before the record's lease ended", tc.name)
			}
			continue
		}
		if !m.claimDue(tc.seen) {
			t.Fatalf("%s: a handover to this process not claimable at once", tc.name)
		}
		var claimAt time.Time
		for _, e := range effs {
			if st, ok := e.(*setTimer); ok && st.t == timerClaim {
				claimAt = st.at
			}
		}
		if claimAt.After(tc.seen.Add(timing.VacancyJitter)) {
			t.Fatalf("%s: claim timer at %v, want within the vacancy jitter of %v", tc.name, claimAt, tc.seen)
		}
		c := findCall(m.step(claimAt, timerInput{timerClaim}), callClaim)
		if c == nil || !c.expected.SameWrite(r) || c.next.Term != 4 {
			t.Fatalf("%s: claim %+v, want term 4 on the handed record", tc.name, c)
		}
	}
}

// A candidate whose claim is in flight takes a handover once the claim's
// reply is in, even when the handover's term is the one it claimed, and
// announces it only after its EventElected.
func TestMachineHandoverWhileClaiming(t *testing.T) {
	m, c, _ := claiming(t)
	participating(m)
	sent := at(11 * time.Millisecond)
	tok := presenceToken(t, m, sent)
	r := rec(1, "a", c.next.Term, timing.LeaseDuration)
	r.Handover = tok
	effs := m.step(at(12*time.Millisecond), notificationInput{n: backend.Notification{Type: backend.RecordChanged, Record: r}, ok: true})
	if m.role != roleCandidate || findEvent(effs, EventNewLeader) != nil {
		t.Fatalf("role %v, effects %v with the claim in flight: want a candidate that announces nothing yet", m.role, effs)
	}
	effs = m.step(at(15*time.Millisecond), callResult{kind: callClaim, expected: c.expected, next: c.next, sentAt: c.sentAt, err: backend.NewConflict(r)})
	el := findEvent(effs, EventElected)
	if el == nil || m.role != roleLeader || !m.leaseEnd.Equal(sent.Add(timing.LeaseDuration)) {
		t.Fatalf("role %v lease to %v, effects %v: want leading until %v", m.role, m.leaseEnd, effs, sent.Add(timing.LeaseDuration))
	}
	// EventElected comes before the record is announced.
	for _, e := range effs {
		if em, ok := e.(*emit); ok && em.ev.Type == EventNewLeader {
			t.Fatalf("effects %v: the record was announced before EventElected", effs)
		}
		if em, ok := e.(*emit); ok && em.ev.Type == EventElected {
			break
		}
	}
}

// A node that led on a handover and resigned does not claim that record
// at once when its resign's write failed: it gave the term up, as for a
// record it wrote itself.
func TestMachineHandoverResignedNotReclaimed(t *testing.T) {
	m := participating(follower(t, rec(3, "x", 2, timing.LeaseDuration), at(5*time.Millisecond)))
	tok := presenceToken(t, m, at(10*time.Millisecond))
	r := rec(4, "a", 3, timing.LeaseDuration)
	r.Handover = tok
	m.step(at(20*time.Millisecond), notificationInput{n: backend.Notification{Type: backend.RecordChanged, Record: r}, ok: true})
	if m.role != roleLeader {
		t.Fatalf("role %v, want leading on the handover", m.role)
	}
	done := make(chan error, 1)
	c := findCall(viewed(m, at(30*time.Millisecond), m.step(at(30*time.Millisecond), requestInput{r: request{kind: reqResign, ctx: context.Background(), reply: done}}), nil, at(time.Hour)), callVacancy)
	if c == nil || !c.expected.SameWrite(r) {
		t.Fatalf("resign wrote %+v, want a write on the handed record", c)
	}
	err := context.DeadlineExceeded
	for i := range 5 {
		m.step(at(time.Duration(31+i)*time.Millisecond), callResult{kind: callVacancy, expected: c.expected, next: c.next, sentAt: at(30 * time.Millisecond), err: err})
	}
	if m.vacancy != nil || !m.rec.SameWrite(r) {
		t.Fatalf("vacancy %+v, record %v: want the resign given up on the handed record", m.vacancy, m.rec)
	}
	if m.claimDue(at(40 * time.Millisecond)) {
		t.Fatal("the node claims at once the handed record it led on and resigned")
	}
}

// A participating node that wins a term refreshes its presence and reads
// the participants at once, so that it can hand over in one write from
// the start of its term.
func TestMachinePresenceReadOnElection(t *testing.T) {
	m, c, _ := claiming(t)
	participating(m)
	res := c.next
	res.Revision = 1
	now := at(20 * time.Millisecond)
	effs := m.step(now, callResult{kind: callClaim, expected: c.expected, next: c.next, sentAt: c.sentAt, res: res})
	var due time.Time
	for _, e := range effs {
		if st, ok := e.(*setTimer); ok && st.t == timerPresence {
			due = st.at
		}
	}
	if m.role != roleLeader || !due.Equal(now) {
		t.Fatalf("role %v, presence timer at %v; want leading and due at once (%v)", m.role, due, now)
	}
	var call presenceCall
	for _, e := range m.step(now, timerInput{timerPresence}) {
		if pc, ok := e.(presenceCall); ok {
			call = pc
		}
	}
	if !call.check || call.term != 1 {
		t.Fatalf("presence call %+v, want a read of the participants in term 1", call)
	}
}

// A leader whose successor's last presence write it read is older than
// three quarters of the lease (a long PresenceInterval, a slow read) does not hand
// the election over in one write the successor could not take (it would
// claim again: a skipped term, two new leaders): it writes the vacancy
// reserved for that successor, which claims it at once.
func TestMachineStaleSuccessorGetsAReservedVacancy(t *testing.T) {
	for _, tc := range []struct {
		name string
		age  time.Duration // of b's presence write when the leader read it
		one  bool
	}{
		{"fresh", timing.LeaseDuration / 2, true},
		{"stale", timing.LeaseDuration/2 + time.Nanosecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, _ := leader(t)
			participating(m)
			m.pres.ttl = time.Second // live at any age here
			store := at(time.Hour)
			ps := []backend.Presence{{Node: "b", CanLead: true, Token: 77, Timestamp: store.Add(-tc.age)}}
			m.pres.busy = true
			m.step(at(30*time.Millisecond), presenceResult{term: 1, check: true, ps: ps, storeNow: store})
			done := make(chan error, 1)
			now := at(30 * time.Millisecond) // at the instant of the read
			c := findCall(viewed(m, now, m.step(now, requestInput{r: request{kind: reqResign, ctx: context.Background(), reply: done}}), ps, store), callVacancy)
			handed := heartbeat.Record{Election: "e", Leader: "b", Term: 2, Lease: timing.LeaseDuration, Handover: 77}
			reserved := heartbeat.Record{Election: "e", Term: 1, Successor: "b"}
			if want := map[bool]heartbeat.Record{true: handed, false: reserved}[tc.one]; c == nil || !c.next.Equal(want) {
				t.Fatalf("resign wrote %+v, want %v", c, want)
			}
		})
	}
}

// claimTimer returns when effs arm the election timer, if they do.
func claimTimer(effs []effect) (time.Time, bool) {
	for _, e := range effs {
		if s, ok := e.(*setTimer); ok && s.t == timerClaim {
			return s.at, true
		}
	}
	return time.Time{}, false
}

// Issue 43: an election of an Elections that hears another one found its
// leader silent claims as soon as its own wait allows (claimWait since it
// observed the record), never sooner; one of another leader, or one it
// leads or claims already, is not moved. The election whose timer found
// the leader silent tells the others.
func TestMachineSilentLeaderJudgedTogether(t *testing.T) {
	seen := at(5 * time.Millisecond)
	m := follower(t, rec(5, "x", 3, timing.LeaseDuration), seen)
	m.together = true
	if got, ok := claimTimer(m.step(at(6*time.Millisecond), silentInput{leader: "x"})); !ok || !got.Equal(seen.Add(m.claimWait())) {
		t.Fatalf("heard x is silent: claim timer %v (armed %v), want %v, the end of its own wait", got, ok, seen.Add(m.claimWait()))
	}
	if _, ok := claimTimer(m.step(at(7*time.Millisecond), silentInput{leader: "y"})); ok {
		t.Fatal("heard another leader is silent: the timer moved")
	}
	late := seen.Add(m.claimWait() + time.Millisecond)
	if got, ok := claimTimer(m.step(late, silentInput{leader: "x"})); !ok || !got.Equal(late) {
		t.Fatalf("heard x is silent after its wait: claim timer %v (armed %v), want at once", got, ok)
	}
	effs := m.step(late, timerInput{timerClaim})
	c := findCall(effs, callClaim)
	var told *leaderSilent
	for _, e := range effs {
		if s, ok := e.(leaderSilent); ok {
			told = &s
		}
	}
	if c == nil || told == nil || told.leader != "x" || told.spread != (timing.ElectionTimeoutMax-timing.ElectionTimeoutMin)/silentSpreadDivisor {
		t.Fatalf("the timer fired on x's silent record: claim %v, told %+v; want a claim, and the others told", c, told)
	}
	if _, ok := claimTimer(m.step(late, silentInput{leader: "x"})); ok {
		t.Fatal("a candidate's timer moved")
	}
}

// Issue 41: a participant handed the election as it stops (the leader
// read its presence before its delete) hands it on, once its own delete
// is done, on a fresh view: the record does not name a node that left
// until the others' election timeout, and two nodes stopping at once do
// not hand it back and forth.
func TestMachineStoppingParticipantPassesTheHandoverOn(t *testing.T) {
	m := participating(follower(t, rec(3, "x", 2, timing.LeaseDuration), at(5*time.Millisecond)))
	tok := presenceToken(t, m, at(10*time.Millisecond))
	effs := m.step(at(20*time.Millisecond), stopInput{ctx: context.Background()})
	if !slices.ContainsFunc(effs, func(e effect) bool { l, ok := e.(leavePresence); return ok && l.tell }) || m.done() {
		t.Fatalf("stop: %v; done %v: want the delete, waited for", effs, m.done())
	}
	h := rec(4, "x", 3, timing.LeaseDuration)
	h.Leader, h.Handover = "a", tok
	if effs := m.step(at(21*time.Millisecond), changed(h)); slices.ContainsFunc(effs, func(e effect) bool { _, ok := e.(handoverView); return ok }) {
		t.Fatal("handed it on before its own delete was done")
	}
	rd := findCall(m.step(at(22*time.Millisecond), leftInput{}), callRead)
	if rd == nil || m.done() {
		t.Fatalf("deleted: read %v, done %v; want a last read of the record", rd, m.done())
	}
	effs = viewed(m, at(23*time.Millisecond), m.step(at(23*time.Millisecond), callResult{kind: callRead, sentAt: rd.sentAt, sentStep: rd.sentStep, parent: rd.parent, res: h}),
		[]backend.Presence{{Node: "c", CanLead: true, Token: 9, Timestamp: at(time.Hour)}}, at(time.Hour))
	c := findCall(effs, callVacancy)
	if c == nil || c.next.Leader != "c" || c.next.Term != 4 || c.next.Handover != 9 || !c.expected.SameWrite(h) {
		t.Fatalf("handed it on with %+v, want the record handed to c in term 4, on the one handed to this node", c)
	}
	if m.role == roleLeader {
		t.Fatal("a stopping node leads")
	}
	m.step(at(24*time.Millisecond), callResult{kind: callVacancy, expected: c.expected, next: c.next, sentAt: at(23 * time.Millisecond), sentStep: c.sentStep, parent: c.parent, res: rec(5, "c", 4, timing.LeaseDuration)})
	if !m.done() {
		t.Fatal("not done once the election was handed on")
	}
}

// On a backend with the guarded write a resigning leader writes at once,
// from the Priority check's last read, guarded by the presence record of
// the participant it names. When that one withdrew since (ErrNotPresent:
// nothing written), it reads the participants and writes again, guarded
// by the next one; a backend that turns out to have no guarded write
// (ErrUnsupported) gets the read, then an unguarded write, and no guard
// again. A stopping leader still withdraws and reads first.
func TestMachineResignGuardedFromView(t *testing.T) {
	store := at(time.Hour)
	b := backend.Presence{Node: "b", CanLead: true, Token: 5, Incarnation: 50, Timestamp: store, Joined: store.Add(-time.Hour)}
	c := backend.Presence{Node: "c", CanLead: true, Token: 6, Incarnation: 60, Timestamp: store, Joined: store.Add(-time.Minute)}
	resign := func(t *testing.T) (*machine, *startCall) {
		m, _ := leader(t)
		participating(m)
		m.pres.busy = true
		m.step(at(30*time.Millisecond), presenceResult{term: 1, check: true, ps: []backend.Presence{b, c}, storeNow: store})
		effs := m.step(at(40*time.Millisecond), requestInput{r: request{kind: reqResign, ctx: context.Background(), reply: make(chan error, 1)}})
		for _, e := range effs {
			if _, ok := e.(handoverView); ok {
				t.Fatal("resign read the participants though its last read is fresh and the write guarded")
			}
		}
		w := findCall(effs, callVacancy)
		if w == nil || w.next.Leader != "c" || w.next.Handover != 6 || w.guard != (backend.Guard{Node: "c", Incarnation: 60}) {
			t.Fatalf("resign wrote %+v, want the election handed to c (joined last) guarded by its presence", w)
		}
		return m, w
	}
	for _, tc := range []struct {
		err   error
		guard backend.Guard // of the write after the read
	}{
		{backend.ErrNotPresent, backend.Guard{Node: "b", Incarnation: 50}},
		{backend.ErrUnsupported, backend.Guard{}},
	} {
		t.Run(tc.err.Error(), func(t *testing.T) {
			m, w := resign(t)
			now := at(41 * time.Millisecond)
			effs := m.step(now, callResult{kind: callVacancy, expected: w.expected, next: w.next, sentAt: at(40 * time.Millisecond), parent: w.parent, err: fmt.Errorf("store: %w", tc.err)})
			var view *handoverView
			for _, e := range effs {
				if v, ok := e.(handoverView); ok {
					view = &v
				}
			}
			if view == nil || view.leave || findCall(effs, callVacancy) != nil {
				t.Fatalf("effects %v after %v, want a read of the participants (no leave) and no write yet", effs, tc.err)
			}
			w2 := findCall(m.step(now, handoverViewResult{ps: []backend.Presence{b}, storeNow: store.Add(11 * time.Millisecond)}), callVacancy)
			if w2 == nil || w2.next.Leader != "b" || w2.next.Handover != 5 || w2.guard != tc.guard {
				t.Fatalf("after %v wrote %+v, want the election handed to b, guard %+v", tc.err, w2, tc.guard)
			}
			if m.noGuard != (tc.err == backend.ErrUnsupported) {
				t.Fatalf("noGuard %v after %v", m.noGuard, tc.err)
			}
		})
	}
}

// A successor whose token, from the Priority check's last read, has grown
// too old for a handover in one write by the time the leader resigns is
// read afresh, not reserved a vacancy: one write, not two.
func TestMachineResignReadsWhenItsViewIsTooOld(t *testing.T) {
	m, _ := leader(t)
	participating(m)
	m.pres.ttl = time.Second
	store := at(time.Hour)
	old := backend.Presence{Node: "b", CanLead: true, Token: 5, Incarnation: 50, Timestamp: store.Add(-timing.LeaseDuration/2 + 5*time.Millisecond)}
	m.pres.busy = true
	m.step(at(30*time.Millisecond), presenceResult{term: 1, check: true, ps: []backend.Presence{old}, storeNow: store})
	now := at(40 * time.Millisecond) // b's token is half a lease and 5 ms old
	effs := m.step(now, requestInput{r: request{kind: reqResign, ctx: context.Background(), reply: make(chan error, 1)}})
	if findCall(effs, callVacancy) != nil {
		t.Fatalf("effects %v: resign wrote from a view whose successor is too old for one write", effs)
	}
	fresh := old
	fresh.Token, fresh.Timestamp = 6, store.Add(10*time.Millisecond)
	w := findCall(viewed(m, now, effs, []backend.Presence{fresh}, store.Add(10*time.Millisecond)), callVacancy)
	if w == nil || w.next.Leader != "b" || w.next.Handover != 6 || w.guard != (backend.Guard{Node: "b", Incarnation: 50}) {
		t.Fatalf("resign wrote %+v after its read, want b handed the election in one write with its new token, guarded", w)
	}
}
