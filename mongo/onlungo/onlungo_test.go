package onlungo

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/256dpi/lungo"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.uber.org/goleak"

	v1options "go.mongodb.org/mongo-driver/mongo/options"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/mongo"
	"github.com/leaderfeed/leaderfeed/mongo/internal/driver"
	"github.com/leaderfeed/leaderfeed/mongo/internal/suite"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// newServer returns a fresh lungo engine for one test, closed when it ends.
func newServer(t *testing.T) *suite.Server {
	t.Helper()
	client, engine, err := lungo.Open(context.Background(), lungo.Options{Store: lungo.NewMemoryStore()})
	if err != nil {
		t.Fatalf("lungo.Open: %v", err)
	}
	t.Cleanup(engine.Close)
	db := client.Database("leaderfeed_test")
	const coll = "elections"
	user := db.Collection(coll)
	id := func(key any) (any, error) { return v1(bson.M{"_id": key}) }
	return &suite.Server{
		Kind: "lungo",
		Coll: coll,
		Open: func(name string) driver.Collection { return Collection(db, name) },
		Put: func(ctx context.Context, key any, doc bson.M) error {
			f, err := id(key)
			if err != nil {
				return err
			}
			d, err := v1(doc)
			if err != nil {
				return err
			}
			_, err = user.ReplaceOne(ctx, f, d, v1options.Replace().SetUpsert(true))
			return err
		},
		Insert: func(ctx context.Context, doc bson.M) error {
			d, err := v1(doc)
			if err != nil {
				return err
			}
			_, err = user.InsertOne(ctx, d)
			return err
		},
		Update: func(ctx context.Context, key any, update bson.M) error {
			f, err := id(key)
			if err != nil {
				return err
			}
			u, err := v1(update)
			if err != nil {
				return err
			}
			_, err = user.UpdateOne(ctx, f, u)
			return err
		},
		Delete: func(ctx context.Context, key any) error {
			f, err := id(key)
			if err != nil {
				return err
			}
			_, err = user.DeleteOne(ctx, f)
			return err
		},
		Drop: func(ctx context.Context) error { return user.Drop(ctx) },
		Transaction: func(ctx context.Context, fn func(ctx context.Context) error) error {
			sess, err := client.StartSession()
			if err != nil {
				return err
			}
			defer sess.EndSession(context.WithoutCancel(ctx))
			_, err = sess.WithTransaction(ctx, func(sc lungo.ISessionContext) (any, error) { return nil, fn(sc) })
			return err
		},
	}
}

// TestSuite runs the MongoDB backend's store tests and the conformance
// suite on lungo, through this package's adapter: the backend's logic is
// the code that runs on the driver v2.
func TestSuite(t *testing.T) { suite.Run(t, newServer) }

func TestNew(t *testing.T) {
	client, engine, err := lungo.Open(context.Background(), lungo.Options{Store: lungo.NewMemoryStore()})
	if err != nil {
		t.Fatal(err)
	}
	defer engine.Close()
	b, err := New(client.Database("app"), "e", mongo.Options{})
	if err != nil || b.Name() != "e" {
		t.Fatalf("New = %v, %v", b, err)
	}
	if err := b.Start(context.Background()); err != nil {
		t.Fatalf("Start on lungo: %v", err)
	}
	_ = b.Close()
	st, err := NewStore(client.Database("app"), mongo.Options{})
	if err != nil || st.Collection() != mongo.DefaultCollection {
		t.Fatalf("NewStore = %v, %v", st, err)
	}
	_ = st.Close()
	for name, f := range map[string]func() (backend.Election, error){
		"nil database":    func() (backend.Election, error) { return New(nil, "e", mongo.Options{}) },
		"the real driver": func() (backend.Election, error) { return New(&lungo.MongoDatabase{}, "e", mongo.Options{}) },
		"bad collection name": func() (backend.Election, error) {
			return New(client.Database("app"), "e", mongo.Options{Collection: "a$"})
		},
		"bad election name": func() (backend.Election, error) { return New(client.Database("app"), "", mongo.Options{}) },
	} {
		if b, err := f(); b != nil || !errors.Is(err, base.ErrInvalidConfig) {
			t.Errorf("%s: %v, %v; want ErrInvalidConfig", name, b, err)
		}
	}
	for name, f := range map[string]func() (*mongo.Store, error){
		"nil database":    func() (*mongo.Store, error) { return NewStore(nil, mongo.Options{}) },
		"the real driver": func() (*mongo.Store, error) { return NewStore(&lungo.MongoDatabase{}, mongo.Options{}) },
	} {
		if st, err := f(); st != nil || !errors.Is(err, base.ErrInvalidConfig) {
			t.Errorf("NewStore, %s: %v, %v; want ErrInvalidConfig", name, st, err)
		}
	}
}
