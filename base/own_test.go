package base

import (
	"testing"

	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// A leader's own write coming back on the feed after the machine took it
// in is dropped before the mailbox (skipOwn); no other notification is.
func TestSkipOwnKnownWrite(t *testing.T) {
	own := heartbeat.Record{Election: "e", Leader: "n1", Term: 3, Revision: 7}
	m := &machine{id: "n1", election: "e", role: roleLeader, term: 3, seen: true, rec: own}
	l := &loop{f: &Feed{id: "n1"}, m: m}
	changed := func(r heartbeat.Record) backend.Notification {
		return backend.Notification{Type: backend.RecordChanged, Record: r}
	}
	newer, other, term := own, own, own
	newer.Revision = 8
	other.Leader = "n2" // the same revision by another node: a store that lost writes
	term.Term = 2

	l.publishOwn()
	for _, c := range []struct {
		n    backend.Notification
		skip bool
	}{
		{changed(own), true},
		{changed(newer), false}, // not taken in yet
		{changed(other), false},
		{changed(term), false},
		{backend.Notification{Type: backend.Ignored, Record: own}, false},
	} {
		if got := l.skipOwn(c.n); got != c.skip {
			t.Errorf("skipOwn(%v %v) = %v, want %v", c.n.Type, c.n.Record, got, c.skip)
		}
	}
	m.role = roleFollower
	l.publishOwn()
	if l.skipOwn(changed(own)) {
		t.Error("skipOwn dropped the own record of a node that no longer leads")
	}
}
