package base

// False reports of a shared node id that the randomized schedules found
// (worlds with unique ids: a node restarted with its id after the earlier
// Feed stopped). Each is an engine fault, reproduced on the machine alone
// and skipped until the engine is fixed: a false ErrDuplicateID pages an
// operator. Run them with -run TestMachineFalseDuplicate -falsedup.

import (
	"errors"
	"flag"
	"testing"
	"time"
)

var falseDup = flag.Bool("falsedup", false, "run the reproductions of the known false ErrDuplicateID reports")

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
	if !*falseDup {
		t.Skip("engine fault reported, not fixed yet: run with -falsedup")
	}
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

// Schedule seeds 124, 204, 316, 983, 1333, 1633, 1777, 1913, 1989 (replay:
// go test ./base -run 'TestSchedules$' -seed=124 -strictdup): a read
// asked after the node's last observation returns an older record (a
// stale replica, or a store that lost writes): the engine takes it as
// authoritative, and when it is a record of the previous process with
// this node id, committed before this process started, reports a
// duplicate.
func TestMachineFalseDuplicateStaleReadOfPredecessor(t *testing.T) {
	if !*falseDup {
		t.Skip("engine fault reported, not fixed yet: run with -falsedup")
	}
	old := rec(5, "a", 3, timing.LeaseDuration)
	old.Incarnation = testInc + 1 // the predecessor's, before this process started
	m := follower(t, rec(7, "x", 4, timing.LeaseDuration), at(5*time.Millisecond))
	rd := findCall(m.step(at(10*time.Millisecond), subscribedInput{ok: true}), callRead)
	if rd == nil || !m.current(rd.sentStep) {
		t.Fatal("the opened feed sent no authoritative read")
	}
	effs := m.step(at(11*time.Millisecond), callResult{kind: callRead, sentAt: rd.sentAt, sentStep: rd.sentStep, res: old})
	if dupReported(effs) || !m.health.DuplicateSeen.IsZero() {
		t.Fatal("reported a duplicate id for a record older than the first one this process saw, written by the process that used the id before")
	}
}
