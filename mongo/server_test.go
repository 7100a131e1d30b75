package mongo_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	mongodrv "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/mongo"
	"github.com/leaderfeed/leaderfeed/mongo/internal/driver"
	"github.com/leaderfeed/leaderfeed/mongo/internal/suite"
)

// testDB is the database the real-server tests use.
const testDB = "leaderfeed_test"

var collSeq atomic.Int64

// realClient connects to LEADERFEED_MONGO_URL for the test, and skips it
// without one. The client is disconnected when the test ends.
func realClient(t *testing.T) *mongodrv.Client {
	t.Helper()
	url := os.Getenv("LEADERFEED_MONGO_URL")
	if url == "" {
		t.Skip("skipped, also in CI by design: no LEADERFEED_MONGO_URL, and no real MongoDB replica set can be installed or pulled here; the suite runs on lungo in mongo/onlungo")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client, err := mongodrv.Connect(options.Client().ApplyURI(url))
	if err == nil {
		t.Cleanup(func() { _ = client.Disconnect(context.Background()) })
		err = client.Ping(ctx, nil)
	}
	if err != nil {
		t.Fatalf("MongoDB at LEADERFEED_MONGO_URL: %v", err)
	}
	return client
}

// TestSuiteOnServer runs the store tests through the driver-v2 adapter
// against the server in LEADERFEED_MONGO_URL (a replica set).
func TestSuiteOnServer(t *testing.T) {
	c := realClient(t)
	db := c.Database(testDB)
	suite.Run(t, func(t *testing.T) *suite.Server {
		coll := fmt.Sprintf("t%d_%d", time.Now().UnixNano()%1e9, collSeq.Add(1))
		var dropOnce sync.Map
		user := func() *mongodrv.Collection { return db.Collection(coll) }
		return &suite.Server{
			Kind: "LEADERFEED_MONGO_URL",
			Real: true,
			Coll: coll,
			Open: func(name string) driver.Collection {
				if _, done := dropOnce.LoadOrStore(name, true); !done {
					t.Cleanup(func() { _ = db.Collection(name).Drop(context.Background()) })
				}
				return mongo.V2Collection(db.Collection(name))
			},
			Put: func(ctx context.Context, key any, doc bson.M) error {
				_, err := user().ReplaceOne(ctx, bson.M{"_id": key}, doc, options.Replace().SetUpsert(true))
				return err
			},
			Insert: func(ctx context.Context, doc bson.M) error {
				_, err := user().InsertOne(ctx, doc)
				return err
			},
			Update: func(ctx context.Context, key any, update bson.M) error {
				_, err := user().UpdateOne(ctx, bson.M{"_id": key}, update)
				return err
			},
			Delete: func(ctx context.Context, key any) error {
				_, err := user().DeleteOne(ctx, bson.M{"_id": key})
				return err
			},
			Drop: func(ctx context.Context) error { return user().Drop(ctx) },
			Transaction: func(ctx context.Context, fn func(ctx context.Context) error) error {
				sess, err := c.StartSession()
				if err != nil {
					return err
				}
				defer sess.EndSession(context.WithoutCancel(ctx))
				_, err = sess.WithTransaction(ctx, func(ctx context.Context) (any, error) { return nil, fn(ctx) })
				return err
			},
		}
	})
}

// TestPublicConstructorsOnServer runs New and NewCollection, the entry
// points users call, against the server in LEADERFEED_MONGO_URL.
func TestPublicConstructorsOnServer(t *testing.T) {
	c := realClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := fmt.Sprintf("pub%d", time.Now().UnixNano()%1e9)
	db := c.Database(testDB)
	t.Cleanup(func() { _ = db.Collection(name).Drop(context.Background()) })
	b1, err := mongo.New(db, "pub", mongo.Options{Collection: name})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b1.Close() }()
	b2, err := mongo.NewCollection(db.Collection(name), "pub", mongo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b2.Close() }()
	for _, b := range []backend.Election{b1, b2} {
		if err := b.Start(ctx); err != nil {
			t.Fatalf("Start: %v", err)
		}
		if err := b.Create(ctx); err != nil {
			t.Fatalf("Create: %v", err)
		}
	}
	ch, err := b2.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r, err := b1.Heartbeat(ctx, heartbeat.Record{}, heartbeat.Record{Leader: "a", Term: 1})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-ch:
		if !n.Record.Equal(r) {
			t.Fatalf("b2 saw %+v, want %+v", n, r)
		}
	case <-ctx.Done():
		t.Fatal("b2 saw nothing")
	}
}
