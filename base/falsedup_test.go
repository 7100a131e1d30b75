package base

// False reports of a shared node id that the randomized schedules found
// (worlds with unique ids: a node restarted with its id after the earlier
// Feed stopped), reproduced on the machine alone: a false ErrDuplicateID
// pages an operator.

import (
	"errors"
	"testing"
	"time"

	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// dupReported reports whether effs report a duplicate id.
func dupReported(effs []effect) bool {
	for _, e := range effs {
		if em, ok := e.(*emit); ok && em.ev.Type == EventError && errors.Is(em.ev.Err, ErrDuplicateID) {
			return true
		}
	}
	return false
}

// Schedule seed 789 (replay: go test ./base -run 'TestSchedules$'
// -seed=789 -strictdup): the previous process with this node id led; its
// renewal was held up in the store when it stopped, and committed after
// this process started and read that process's record. Nobody else uses
// the id, but the late renewal (another incarnation, a revision newer than
// the one read at start) is reported as a duplicate.
func TestMachineFalseDuplicateLateCommitOfPredecessor(t *testing.T) {
	last := rec(5, "a", 3, timing.LeaseDuration)
	last.Incarnation = testInc + 1 // the predecessor's
	m := follower(t, last, at(5*time.Millisecond))
	late := last
	late.Revision = 6 // its renewal, sent before it stopped, commits now
	effs := m.step(at(30*time.Millisecond), changed(late))
	if dupReported(effs) || !m.health.DuplicateSeen.IsZero() {
		t.Fatal("reported a duplicate id for the late renewal of the process that used the id before this one")
	}
}

// Schedule seeds 124, 204, 316, 983, 1333, 1633, 1777, 1913, 1989, 100705,
// 103170, 107088, 130266 (replay, a few times if need be: go test ./base
// -run 'TestSchedules$' -seed=124 -strictdup): a read asked after the
// node's last observation returns an older record (a stale replica, or a
// store that lost writes), which the engine takes as authoritative. When
// that is a record of the previous process with this node id, committed
// before this process started, or when it takes the view back behind such
// a record, which then comes again, the record is reported as a
// duplicate.
func TestMachineFalseDuplicateStaleReadOfPredecessor(t *testing.T) {
	pred := rec(5, "a", 3, timing.LeaseDuration)
	pred.Incarnation = testInc + 1 // the predecessor's, before this process started
	for _, tc := range []struct {
		name  string
		first heartbeat.Record   // the first read's record
		reads []heartbeat.Record // the reads after it
	}{
		{"the stale read returns the predecessor's record", rec(7, "x", 4, timing.LeaseDuration), []heartbeat.Record{pred}},
		{"the stale read goes behind it, and it comes again", pred, []heartbeat.Record{rec(4, "", 2, 0), pred}},
		{"... twice", pred, []heartbeat.Record{rec(4, "", 2, 0), pred, rec(4, "", 2, 0), pred}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := follower(t, tc.first, at(5*time.Millisecond))
			for i, r := range tc.reads {
				now := at(time.Duration(10+i) * time.Millisecond)
				rd := findCall(m.step(now, subscribedInput{ok: true}), callRead)
				if rd == nil || !m.current(rd.sentStep) {
					t.Fatal("the opened feed sent no authoritative read")
				}
				effs := m.step(now, callResult{kind: callRead, sentAt: rd.sentAt, sentStep: rd.sentStep, res: r})
				if dupReported(effs) || !m.health.DuplicateSeen.IsZero() {
					t.Fatalf("reported a duplicate id for the predecessor's record, written before this process started (read %d: %v)", i+1, r)
				}
			}
		})
	}
}

// Schedule seeds 301643 and 315118 (replay: go test ./base -run
// 'TestSchedules$' -seed=301643 -v, on the commit before this test): the
// first read after a restart is stale (an older renewal of the
// predecessor), the next read finds its newest renewal, committed before
// this process started, and then its last claim commits late: two newer
// writes of one incarnation since start, both the predecessor's. Only
// writes known to be committed since start (the feed's, those above one)
// count; a second one of those is a twin, reported.
func TestMachineFalseDuplicateStaleReadThenLateCommit(t *testing.T) {
	pred := rec(163, "a", 21, timing.LeaseDuration)
	pred.Incarnation = testInc + 1
	m := follower(t, pred, at(5*time.Millisecond)) // the stale first read
	newest := pred
	newest.Revision, newest.Term = 166, 23
	rd := findCall(m.step(at(6*time.Millisecond), subscribedInput{ok: true}), callRead)
	if rd == nil {
		t.Fatal("the opened feed sent no read")
	}
	if effs := m.step(at(7*time.Millisecond), callResult{kind: callRead, sentAt: rd.sentAt, sentStep: rd.sentStep, res: newest}); dupReported(effs) {
		t.Fatal("reported the predecessor's newest renewal, read after a stale read")
	}
	late := newest
	late.Revision, late.Term = 167, 24
	if effs := m.step(at(20*time.Millisecond), changed(late)); dupReported(effs) || !m.health.DuplicateSeen.IsZero() {
		t.Fatal("reported the predecessor's claim that committed late")
	}
	// Another write of that incarnation, through the feed: its writer
	// knew revision 167, committed since this process started: a twin.
	twin := late
	twin.Revision = 168
	if effs := m.step(at(30*time.Millisecond), changed(twin)); !dupReported(effs) || m.health.DuplicateSeen.IsZero() {
		t.Fatal("a second write committed since start, of one other incarnation, not reported")
	}
}
