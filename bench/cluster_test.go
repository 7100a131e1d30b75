package main

import (
	"strings"
	"testing"
)

// TestLeaderless: a wait that timed out names the elections without a live
// leader and how each one's last leadership ended.
func TestLeaderless(t *testing.T) {
	live, dead := &nodeProc{name: "n1#1"}, &nodeProc{name: "n2#2", killedAt: 5}
	c := &cluster{elections: 5, procs: []*nodeProc{live, dead}, open: map[string]*belief{}}
	led := &belief{proc: live.name, idx: 0, start: 1}
	resigned := &belief{proc: live.name, idx: 1, start: 1, end: 2, reason: "resigned"}
	older := &belief{proc: dead.name, idx: 1, start: 0, end: 1, reason: "killed"}
	orphan := &belief{proc: dead.name, idx: 3, start: 1}
	ledToo := &belief{proc: live.name, idx: 4, start: 1}
	c.beliefs = []*belief{led, resigned, older, orphan, ledToo}
	c.open[live.name+"/0"], c.open[dead.name+"/3"], c.open[live.name+"/4"] = led, orphan, ledToo
	got := c.leaderless(3)
	for _, want := range []string{"election 1: last led by n1#1, ended (resigned)", "election 2: never led", "election 3: last led by n2#2, a process no longer live"} {
		if !strings.Contains(got, want) {
			t.Errorf("leaderless(3) = %q, missing %q", got, want)
		}
	}
	if strings.Contains(got, "election 0") || strings.Contains(got, "election 4") {
		t.Errorf("leaderless(3) = %q names a led election", got)
	}
	if got := c.leaderless(1); strings.Count(got, "election ") != 1 {
		t.Errorf("leaderless(1) = %q, want one election", got)
	}
}
