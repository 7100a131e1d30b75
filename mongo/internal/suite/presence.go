package suite

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/mongo"
	"github.com/leaderfeed/leaderfeed/mongo/internal/driver"
)

// between runs a function once, after the first conditional write of a
// Present matched no document and before the second: what another
// writer of the same presence document may do there.
type between struct {
	driver.Collection
	fn func()
}

func (b *between) FindOneAndUpdate(ctx context.Context, filter, update bson.D, upsert bool) (bson.Raw, error) {
	raw, err := b.Collection.FindOneAndUpdate(ctx, filter, update, upsert)
	if !upsert && errors.Is(err, driver.ErrNoDocument) && b.fn != nil {
		fn := b.fn
		b.fn = nil
		fn()
	}
	return raw, err
}

// testPresenceJoined: a presence document of an older version (no
// incarnation, no joined) reads with incarnation 0 and no joined time; a
// write of incarnation 0 keeps it so, a write of another incarnation sets
// joined to its timestamp. A write of the same incarnation that lands
// between Present's two conditional writes makes Present refresh that
// document, keeping its joined time, not take it for a new one.
func testPresenceJoined(t *testing.T, newServer NewServer) {
	s := newServer(t)
	ctx := testCtx(t)
	st := s.started(t, electionName(t)).Store
	el := electionName(t)
	read := func(node string) backend.Presence {
		t.Helper()
		ps, _, err := st.Participants(ctx, el)
		if err != nil {
			t.Fatalf("Participants: %v", err)
		}
		for _, p := range ps {
			if p.Node == node {
				return p
			}
		}
		t.Fatalf("Participants = %+v, want %s listed", ps, node)
		return backend.Presence{}
	}
	present := func(st *mongo.Store, p backend.Presence) {
		t.Helper()
		if err := st.Present(ctx, el, p); err != nil {
			t.Fatalf("Present(%s, incarnation %d): %v", p.Node, p.Incarnation, err)
		}
	}

	if err := s.Put(ctx, backend.PresenceKey(el, "old"), bson.M{"leaderfeed": 2, "election": el, "node": "old", "priority": 0,
		"can_lead": true, "value": []byte{}, "ts": time.Now()}); err != nil {
		t.Fatal(err)
	}
	if p := read("old"); p.Incarnation != 0 || !p.Joined.IsZero() || p.Timestamp.IsZero() {
		t.Fatalf("an older version's presence reads %+v; want incarnation 0 and no joined time", p)
	}
	present(st, backend.Presence{Node: "old", CanLead: true})
	if p := read("old"); p.Incarnation != 0 || !p.Joined.IsZero() {
		t.Fatalf("after a write of incarnation 0 over an older version's presence: %+v; want no joined time kept", p)
	}
	present(st, backend.Presence{Node: "old", CanLead: true, Incarnation: 7})
	if p := read("old"); p.Incarnation != 7 || !p.Joined.Equal(p.Timestamp) {
		t.Fatalf("after a write of incarnation 7 over an older version's presence: %+v; want it joined at its timestamp", p)
	}

	other := s.store(t, mongo.Options{})
	racing := &between{Collection: s.Open(s.Coll)}
	v, err := driver.NewStore(racing, mongo.Options{Collection: s.Coll})
	if err != nil {
		t.Fatal(err)
	}
	slow := v.(*mongo.Store)
	defer slow.Close()
	var first backend.Presence
	racing.fn = func() {
		present(other, backend.Presence{Node: "twin", CanLead: true, Incarnation: 5})
		first = read("twin")
	}
	present(slow, backend.Presence{Node: "twin", CanLead: true, Incarnation: 5, Token: 1})
	if racing.fn != nil {
		t.Fatal("Present's first write matched a document that did not exist")
	}
	if p := read("twin"); p.Incarnation != 5 || p.Token != 1 || !p.Joined.Equal(first.Joined) || p.Timestamp.Before(first.Timestamp) {
		t.Fatalf("a Present that met a write of its incarnation between its writes: %+v; want that write's joined time %v kept, and its own token", p, first.Joined)
	}
}
