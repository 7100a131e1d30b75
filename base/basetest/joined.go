package basetest

import (
	"errors"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// clockWait bounds how long the Joined rules wait for the store's clock to
// move past a timestamp it gave (a store with millisecond timestamps needs
// a millisecond).
var clockWait = Scaled(5 * time.Second)

// presenceJoined runs the rules of Presence.Incarnation and Presence.Joined
// through Present and Participants.
func (s *suite) presenceJoined(t *testing.T) {
	rule(t, "A presence record's incarnation is stored as written, exactly up to MaxToken, 0 as 0, and one over MaxToken is refused with nothing written; Joined is the store's Timestamp of the write that created the record (also after Absent) or changed its incarnation, and a write of the same incarnation keeps it", func(t *testing.T) {
		ps := storeAs[backend.PresenceStore](t, s)
		e := Election()
		checkJoined(t, joinedIO{
			write: func(p backend.Presence) error { return ps.Present(ctxFor(t), e, p) },
			read: func() map[string]backend.Presence {
				t.Helper()
				got, _, err := ps.Participants(ctxFor(t), e)
				if err != nil {
					t.Fatalf("Participants: %v", err)
				}
				return byNode(t, got)
			},
			absent: func(node string) error { return ps.Absent(ctxFor(t), e, node) },
		})
	})
}

// presenceBatchJoined runs the rules of Presence.Incarnation and
// Presence.Joined through PresentBatch and ParticipantsBatch.
func (s *suite) presenceBatchJoined(t *testing.T) {
	rule(t, "PresentBatch stores the incarnation and sets or keeps Joined as Present does (a write with an incarnation over MaxToken fails alone and writes nothing), and ParticipantsBatch returns both as Participants does", func(t *testing.T) {
		ps := storeAs[backend.PresenceBatchStore](t, s)
		e1, e2 := Election(), Election()
		batchRead := func(elections ...string) []map[string]backend.Presence {
			t.Helper()
			res, err := ps.ParticipantsBatch(ctxFor(t), elections)
			if err != nil || len(res) != len(elections) {
				t.Fatalf("ParticipantsBatch = %+v, %v; want %d results", res, err, len(elections))
			}
			out := make([]map[string]backend.Presence, len(res))
			for i, r := range res {
				if r.Err != nil {
					t.Fatalf("ParticipantsBatch, election %d: %v", i, r.Err)
				}
				out[i] = byNode(t, r.Presences)
			}
			return out
		}
		checkJoined(t, joinedIO{
			write: func(p backend.Presence) error {
				errs, err := ps.PresentBatch(ctxFor(t), []backend.PresenceWrite{{Election: e1, Presence: p}})
				if err != nil || len(errs) != 1 {
					t.Fatalf("PresentBatch = %v, %v; want one result", errs, err)
				}
				return errs[0]
			},
			read:   func() map[string]backend.Presence { return batchRead(e1)[0] },
			absent: func(node string) error { return ps.Absent(ctxFor(t), e1, node) },
		})

		// Several writes in one batch, each judged against its own
		// record: a first write, a refresh, a new incarnation, and a
		// refused one that leaves its record as it was.
		before := batchRead(e1)[0]
		errs, err := ps.PresentBatch(ctxFor(t), []backend.PresenceWrite{
			{Election: e2, Presence: backend.Presence{Node: "node-x", CanLead: true, Incarnation: 3}},
			{Election: e1, Presence: backend.Presence{Node: "node-a", CanLead: true, Incarnation: before["node-a"].Incarnation}},
			{Election: e1, Presence: backend.Presence{Node: "node-b", CanLead: true, Incarnation: before["node-b"].Incarnation + 1}},
			{Election: e1, Presence: backend.Presence{Node: "node-c", CanLead: true, Incarnation: heartbeat.MaxToken + 1}},
		})
		if err != nil || len(errs) != 4 {
			t.Fatalf("PresentBatch = %v, %v; want four results", errs, err)
		}
		for i := range 3 {
			if errs[i] != nil {
				t.Fatalf("write %d: %v, want it written", i, errs[i])
			}
		}
		if !errors.Is(errs[3], heartbeat.ErrInvalidRecord) {
			t.Fatalf("write 3 (incarnation over MaxToken): %v, want an error matching heartbeat.ErrInvalidRecord, and the write alone to fail", errs[3])
		}
		got := batchRead(e1, e2)
		if x := got[1]["node-x"]; x.Incarnation != 3 || !x.Joined.Equal(x.Timestamp) {
			t.Fatalf("a batch's first write of node-x: incarnation %d, joined %v, timestamp %v; want 3, joined at its timestamp", x.Incarnation, x.Joined, x.Timestamp)
		}
		if a := got[0]["node-a"]; !a.Joined.Equal(before["node-a"].Joined) || a.Timestamp.Before(before["node-a"].Timestamp) {
			t.Fatalf("a batch's refresh of node-a: joined %v, timestamp %v; want joined kept (%v), timestamp not before %v", a.Joined, a.Timestamp, before["node-a"].Joined, before["node-a"].Timestamp)
		}
		if b := got[0]["node-b"]; b.Incarnation != before["node-b"].Incarnation+1 || !b.Joined.Equal(b.Timestamp) || b.Timestamp.Before(before["node-b"].Timestamp) {
			t.Fatalf("a batch's write of node-b with another incarnation: %+v; want incarnation %d, joined at its timestamp", b, before["node-b"].Incarnation+1)
		}
		if c := got[0]["node-c"]; !samePresence(c, before["node-c"]) {
			t.Fatalf("node-c after a refused write: %+v; want it unchanged, %+v", c, before["node-c"])
		}
		// Participants reads what ParticipantsBatch does.
		for i, e := range []string{e1, e2} {
			one, _, err := ps.Participants(ctxFor(t), e)
			if err != nil {
				t.Fatalf("Participants: %v", err)
			}
			if m := byNode(t, one); !maps.EqualFunc(m, got[i], samePresence) {
				t.Fatalf("Participants(%s) = %+v, ParticipantsBatch gave %+v: want the same incarnations, timestamps and joined times", e, m, got[i])
			}
		}
	})
}

// joinedIO is how checkJoined writes and reads the presence records of one
// election.
type joinedIO struct {
	write  func(backend.Presence) error
	read   func() map[string]backend.Presence // by node
	absent func(node string) error
}

// checkJoined checks the Incarnation and Joined rules through io, with
// the store's own timestamps only. Two quick writes may be stamped with
// one instant, so before each write whose Joined must differ from the one
// stored, the record is refreshed until the store's clock has moved past
// that Joined.
func checkJoined(t *testing.T, io joinedIO) {
	t.Helper()
	write := func(p backend.Presence) backend.Presence {
		t.Helper()
		if err := io.write(p); err != nil {
			t.Fatalf("presence write of %s (incarnation %d): %v", p.Node, p.Incarnation, err)
		}
		got, ok := io.read()[p.Node]
		if !ok {
			t.Fatalf("presence of %s not listed after its write", p.Node)
		}
		if got.Incarnation != p.Incarnation {
			t.Fatalf("presence of %s reads incarnation %d, written %d: want it exactly as written", p.Node, got.Incarnation, p.Incarnation)
		}
		if got.Timestamp.IsZero() || got.Joined.IsZero() {
			t.Fatalf("presence of %s reads timestamp %v, joined %v: want both set by the store", p.Node, got.Timestamp, got.Joined)
		}
		return got
	}
	// joined writes p, which creates the record or changes its
	// incarnation: Joined is the write's Timestamp, later than prev's
	// Joined (zero: none).
	joined := func(p backend.Presence, prev backend.Presence) backend.Presence {
		t.Helper()
		got := write(p)
		if !got.Joined.Equal(got.Timestamp) {
			t.Fatalf("presence of %s (incarnation %d, before %d) reads joined %v, timestamp %v: a write that creates the record or changes its incarnation sets Joined to its own Timestamp",
				p.Node, p.Incarnation, prev.Incarnation, got.Joined, got.Timestamp)
		}
		if !prev.Joined.IsZero() && !got.Joined.After(prev.Joined) {
			t.Fatalf("presence of %s (incarnation %d, before %d) reads joined %v, the record before it joined %v (timestamp %v): want the new write's time",
				p.Node, p.Incarnation, prev.Incarnation, got.Joined, prev.Joined, prev.Timestamp)
		}
		return got
	}
	// refresh writes p (the incarnation stored) until two writes in a row
	// are stamped after the Joined they keep: a store that took the
	// previous Timestamp for Joined fails at the second.
	refresh := func(p backend.Presence, prev backend.Presence) backend.Presence {
		t.Helper()
		deadline := time.Now().Add(clockWait)
		for moved := 0; ; {
			got := write(p)
			if !got.Joined.Equal(prev.Joined) {
				t.Fatalf("presence of %s reads joined %v after a write of the same incarnation %d, %v before it: a write of the same incarnation keeps Joined",
					p.Node, got.Joined, p.Incarnation, prev.Joined)
			}
			if got.Timestamp.Before(prev.Timestamp) {
				t.Fatalf("presence of %s refreshed at %v, the write before it at %v: want a store timestamp not earlier", p.Node, got.Timestamp, prev.Timestamp)
			}
			if got.Timestamp.After(got.Joined) {
				if moved++; moved == 2 {
					return got
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("presence of %s: the store stamped every refresh %v, for %v: its clock does not move", p.Node, got.Timestamp, clockWait)
			}
			prev = got
			time.Sleep(time.Millisecond)
		}
	}

	var none backend.Presence
	a := joined(backend.Presence{Node: "node-a", CanLead: true, Incarnation: heartbeat.MaxToken}, none)
	b := joined(backend.Presence{Node: "node-b", CanLead: true, Incarnation: 1, Token: 1}, none)
	c := joined(backend.Presence{Node: "node-c", CanLead: true}, none)

	// The same incarnation: Joined stays while the Timestamp moves, also
	// when the other fields change.
	a = refresh(backend.Presence{Node: "node-a", Value: []byte("a"), Priority: 5, CanLead: true, Token: 9, Incarnation: heartbeat.MaxToken}, a)
	b = refresh(backend.Presence{Node: "node-b", CanLead: true, Incarnation: 1, Token: 2}, b)
	c = refresh(backend.Presence{Node: "node-c", CanLead: true}, c)

	// Another incarnation: joined anew, in both directions, and kept
	// by that incarnation's refreshes.
	joined(backend.Presence{Node: "node-b", CanLead: true, Incarnation: 0}, b)
	c = joined(backend.Presence{Node: "node-c", CanLead: true, Incarnation: 1}, c)
	refresh(backend.Presence{Node: "node-c", CanLead: true, Incarnation: 1}, c)
	a = joined(backend.Presence{Node: "node-a", CanLead: true, Incarnation: 2}, a)

	// After Absent, the same incarnation joins anew: the record is new.
	a = refresh(backend.Presence{Node: "node-a", CanLead: true, Incarnation: 2}, a)
	if err := io.absent("node-a"); err != nil {
		t.Fatalf("Absent(node-a): %v", err)
	}
	if _, ok := io.read()["node-a"]; ok {
		t.Fatal("node-a listed after Absent")
	}
	joined(backend.Presence{Node: "node-a", CanLead: true, Incarnation: 2}, a)

	// An incarnation over MaxToken is refused, and nothing is written.
	want := io.read()
	for _, node := range []string{"node-c", "node-d"} {
		err := io.write(backend.Presence{Node: node, CanLead: true, Incarnation: heartbeat.MaxToken + 1})
		if !errors.Is(err, heartbeat.ErrInvalidRecord) {
			t.Fatalf("a presence write of %s with an incarnation over MaxToken: %v, want an error matching heartbeat.ErrInvalidRecord", node, err)
		}
	}
	if got := io.read(); !maps.EqualFunc(got, want, samePresence) {
		t.Fatalf("presence records after refused writes: %+v; want them unchanged, %+v", got, want)
	}
}

// byNode indexes presences by node, failing the test on a repeated node.
func byNode(t *testing.T, ps []backend.Presence) map[string]backend.Presence {
	t.Helper()
	out := make(map[string]backend.Presence, len(ps))
	for _, p := range ps {
		if _, dup := out[p.Node]; dup {
			t.Fatalf("presence of %s listed twice: %+v", p.Node, ps)
		}
		out[p.Node] = p
	}
	return out
}

// samePresence reports whether a and b hold the same fields, times
// compared as instants.
func samePresence(a, b backend.Presence) bool {
	return a.Node == b.Node && slices.Equal(a.Value, b.Value) && a.Priority == b.Priority && a.CanLead == b.CanLead &&
		a.Token == b.Token && a.Incarnation == b.Incarnation && a.Timestamp.Equal(b.Timestamp) && a.Joined.Equal(b.Joined)
}
