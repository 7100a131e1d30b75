package base

import (
	"sync"
	"testing"
	"testing/synctest"

	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/internal/mailbox"
)

// A leader's own write coming back on the feed does not wake the loop
// when the renewal's reply brings it (ownNote): before the reply it is
// held back, after it dropped. Every other notification reaches the
// mailbox, in the feed's order.
func TestOwnNotes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		own := heartbeat.Record{Election: "e", Leader: "n1", Term: 3, Revision: 7}
		m := &machine{id: "n1", election: "e", role: roleLeader, term: 3, claimTerm: 3, seen: true, rec: own}
		var mu sync.Mutex
		var got []string
		l := &loop{f: &Feed{id: "n1"}, m: m}
		l.box = mailbox.New(func(in input) {
			mu.Lock()
			defer mu.Unlock()
			n := in.(notifyMsg).n
			got = append(got, n.Type.String()+" "+n.Record.String())
		}, nil, nil)
		changed := func(r heartbeat.Record) backend.Notification {
			return backend.Notification{Type: backend.RecordChanged, Record: r}
		}
		with := func(r heartbeat.Record, f func(*heartbeat.Record)) heartbeat.Record { f(&r); return r }
		next := with(own, func(r *heartbeat.Record) { r.Revision = 8 })
		check := func(step string, want ...backend.Notification) {
			t.Helper()
			synctest.Wait()
			mu.Lock()
			defer mu.Unlock()
			var w []string
			for _, n := range want {
				w = append(w, n.Type.String()+" "+n.Record.String())
			}
			if len(got) != len(w) {
				t.Fatalf("%s: the loop took %q, want %q", step, got, w)
			}
			for i := range w {
				if got[i] != w[i] {
					t.Fatalf("%s: the loop took %q, want %q", step, got, w)
				}
			}
			got = nil
		}

		l.publishOwn()
		l.note(1, changed(own), true)
		check("the record held")
		for _, r := range []heartbeat.Record{next, with(own, func(r *heartbeat.Record) { r.Leader = "n2" }), with(own, func(r *heartbeat.Record) { r.Term = 2 })} {
			l.note(1, changed(r), true)
			synctest.Wait() // the mailbox would coalesce them
		}
		check("no renewal in flight", changed(next), changed(with(own, func(r *heartbeat.Record) { r.Leader = "n2" })), changed(with(own, func(r *heartbeat.Record) { r.Term = 2 })))

		m.writing = true // a renewal is sent
		l.publishOwn()
		l.note(1, changed(next), true)
		check("before the reply")
		m.writing, m.rec = false, next // its reply brought it
		l.publishOwn()
		check("after the reply")

		m.rec = own
		m.writing = true
		l.publishOwn()
		l.note(1, changed(next), true)
		m.writing = false // the reply was an error
		l.publishOwn()
		check("after a failed reply", changed(next))

		m.writing = true
		l.publishOwn()
		l.note(1, changed(next), true)
		other := backend.Notification{Type: backend.OtherChanged}
		l.note(1, other, true)
		check("another record changed", changed(next), other)

		l.note(1, changed(next), true)
		later := with(next, func(r *heartbeat.Record) { r.Revision, r.Leader = 9, "n2" })
		l.note(1, changed(later), true)
		m.writing = false
		l.publishOwn()
		check("a later write", changed(later))
	})
}
