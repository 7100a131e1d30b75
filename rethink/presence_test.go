package rethink_test

import (
	"testing"

	r "gopkg.in/rethinkdb/rethinkdb-go.v6"

	"github.com/leaderfeed/leaderfeed/base/backend"
)

// TestReplaceOfMissingDocument: Present's one write is
// get(id).replace(func), which a RethinkDB server runs as an insert when
// there is no document. reqlite skips it instead; Present then inserts
// (conflict "error") in a second query.
func TestReplaceOfMissingDocument(t *testing.T) {
	db := newDatabase(t)
	openStore(t, nil, db, table)
	s := connect(t)
	res, err := r.DB(db).Table(table).Get("missing").Replace(func(old r.Term) any {
		return r.Branch(old.Eq(nil), map[string]any{"id": "missing", "joined": r.Now()}, old)
	}).RunWrite(s)
	switch {
	case err != nil:
		t.Fatal(err)
	case server.reqlite:
		if res.Skipped != 1 || res.Inserted != 0 {
			t.Fatalf("reqlite: replace of a missing document: %+v; it skipped it before (if it inserts now, Present's second query is never needed there either)", res)
		}
		t.Log("reqlite: replace of a missing document is skipped, not an insert; Present inserts it in a second query")
	case res.Inserted != 1:
		t.Fatalf("replace of a missing document: %+v, want it inserted", res)
	}
}

// TestPresenceOlderDocument: a presence document of an older version (no
// incarnation, no joined) reads with incarnation 0 and no joined time, a
// write of incarnation 0 keeps it so (the same incarnation keeps the
// joined time, none here), and a write of another incarnation sets the
// joined time to its timestamp.
func TestPresenceOlderDocument(t *testing.T) {
	db := newDatabase(t)
	st := openStore(t, nil, db, table).(backend.PresenceStore)
	s := connect(t)
	ctx := testCtx(t)
	legacy := map[string]any{"id": backend.PresenceKey("e", "n"), "leaderfeed": 2, "election": "e", "node": "n", "priority": 0,
		"can_lead": true, "value": nil, "timestamp": r.Now()}
	if _, err := r.DB(db).Table(table).Insert(legacy).RunWrite(s); err != nil {
		t.Fatal(err)
	}
	read := func() backend.Presence {
		t.Helper()
		ps, _, err := st.Participants(ctx, "e")
		if err != nil || len(ps) != 1 {
			t.Fatalf("Participants = %+v, %v; want n alone", ps, err)
		}
		return ps[0]
	}
	if p := read(); p.Incarnation != 0 || !p.Joined.IsZero() || p.Timestamp.IsZero() || !p.CanLead {
		t.Fatalf("an older version's presence reads %+v; want incarnation 0 and no joined time", p)
	}
	if err := st.Present(ctx, "e", backend.Presence{Node: "n", CanLead: true}); err != nil {
		t.Fatal(err)
	}
	if p := read(); p.Incarnation != 0 || !p.Joined.IsZero() {
		t.Fatalf("after a write of incarnation 0 over an older version's presence: %+v; want no joined time kept", p)
	}
	if err := st.Present(ctx, "e", backend.Presence{Node: "n", CanLead: true, Incarnation: 7}); err != nil {
		t.Fatal(err)
	}
	if p := read(); p.Incarnation != 7 || !p.Joined.Equal(p.Timestamp) {
		t.Fatalf("after a write of incarnation 7 over an older version's presence: %+v; want it joined at its timestamp", p)
	}
	// A joined time of the wrong type reads as none (the refreshes of the
	// incarnation keep it); an incarnation of the wrong type makes the
	// document malformed: left out, until the next write replaces it.
	if _, err := r.DB(db).Table(table).Get(backend.PresenceKey("e", "n")).Update(map[string]any{"joined": "yesterday"}).RunWrite(s); err != nil {
		t.Fatal(err)
	}
	if p := read(); p.Incarnation != 7 || !p.Joined.IsZero() {
		t.Fatalf("with a joined time that is not a TIME: %+v; want no joined time", p)
	}
	for _, bad := range []map[string]any{{"incarnation": -1}, {"incarnation": "7"}, {"incarnation": 1.5}} {
		if _, err := r.DB(db).Table(table).Get(backend.PresenceKey("e", "n")).Update(bad).RunWrite(s); err != nil {
			t.Fatal(err)
		}
		if ps, _, err := st.Participants(ctx, "e"); err != nil || len(ps) != 0 {
			t.Fatalf("with %v: Participants = %+v, %v; want the malformed document left out", bad, ps, err)
		}
		if err := st.Present(ctx, "e", backend.Presence{Node: "n", CanLead: true, Incarnation: 7}); err != nil {
			t.Fatal(err)
		}
	}
}
