package mongo

import (
	"context"
	"errors"
	"math"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	mongodrv "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
)

// Fence checks its arguments, and that ctx carries a transaction, before
// it sends anything.
func TestFenceRejectsBadArguments(t *testing.T) {
	client := unconnected(t)
	db := client.Database("app")
	s, err := NewStore(db, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	ctx := context.Background()
	sess, err := client.StartSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.EndSession(ctx)
	noTxn := mongodrv.NewSessionContext(ctx, sess) // a session, no transaction started
	for _, tc := range []struct {
		name     string
		ctx      context.Context
		election string
		term     uint64
	}{
		{"empty election", ctx, "", 1},
		{"term 0", ctx, "e", 0},
		{"term beyond int64", ctx, "e", math.MaxInt64 + 1},
		{"no session", ctx, "e", 1},
		{"a session without a transaction", noTxn, "e", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := s.Fence(tc.ctx, tc.election, tc.term); !errors.Is(err, base.ErrInvalidConfig) {
				t.Fatalf("Store.Fence: %v, want ErrInvalidConfig", err)
			}
			if err := Fence(tc.ctx, db, Options{}, tc.election, tc.term); !errors.Is(err, base.ErrInvalidConfig) {
				t.Fatalf("Fence: %v, want ErrInvalidConfig", err)
			}
		})
	}
	if err := Fence(ctx, nil, Options{}, "e", 1); !errors.Is(err, base.ErrInvalidConfig) {
		t.Fatalf("Fence on a nil database: %v, want ErrInvalidConfig", err)
	}
	if err := Fence(ctx, db, Options{Collection: "a$b"}, "e", 1); !errors.Is(err, base.ErrInvalidConfig) {
		t.Fatalf("Fence on a bad collection name: %v, want ErrInvalidConfig", err)
	}
	_ = s.Close()
	if err := s.Fence(ctx, "e", 1); !errors.Is(err, base.ErrClosed) {
		t.Fatalf("Fence on a closed store: %v, want ErrClosed", err)
	}
}

// The event of a fence's write (an update of the fence counter alone) is
// dropped by its shape, also by a stream that knows no revision of the
// record yet; an update that changed the record as well is delivered.
func TestFenceEventDropped(t *testing.T) {
	s, err := NewStore(unconnected(t).Database("app"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	doc := bson.D{{Key: "_id", Value: "e"}, {Key: fieldMark, Value: int32(1)}, {Key: fieldLeader, Value: "a"},
		{Key: fieldTerm, Value: int64(1)}, {Key: fieldRevision, Value: int64(3)}, {Key: fieldTimestamp, Value: bson.DateTime(1)},
		{Key: fieldValue, Value: bson.Binary{Data: []byte{}}}, {Key: fieldFence, Value: int64(7)}}
	event := func(op string, updated bson.D, removed bson.A) *changeEvent {
		raw, err := bson.Marshal(bson.D{{Key: "operationType", Value: op},
			{Key: "documentKey", Value: bson.D{{Key: "_id", Value: "e"}}}, {Key: "fullDocument", Value: doc},
			{Key: "updateDescription", Value: bson.D{{Key: "updatedFields", Value: updated}, {Key: "removedFields", Value: removed}}}})
		if err != nil {
			t.Fatal(err)
		}
		var ev changeEvent
		if err := bson.Unmarshal(raw, &ev); err != nil {
			t.Fatal(err)
		}
		return &ev
	}
	for _, tc := range []struct {
		name    string
		ev      *changeEvent
		deliver bool
	}{
		{"the fence alone", event("update", bson.D{{Key: fieldFence, Value: int64(7)}}, bson.A{}), false},
		{"the fence and the leader", event("update", bson.D{{Key: fieldFence, Value: int64(7)}, {Key: fieldLeader, Value: "a"}}, bson.A{}), true},
		{"the fence and a removed field", event("update", bson.D{{Key: fieldFence, Value: int64(7)}}, bson.A{"x"}), true},
		{"a replace", event("replace", bson.D{{Key: fieldFence, Value: int64(7)}}, bson.A{}), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := s.translate(tc.ev, newStreamState())
			if got := len(ns) == 1 && ns[0].Type == backend.RecordChanged; got != tc.deliver || !tc.deliver && len(ns) != 0 {
				t.Fatalf("translate: %+v, want delivered %v", ns, tc.deliver)
			}
		})
	}
}
