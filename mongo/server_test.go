package mongo

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/256dpi/lungo"
	"go.mongodb.org/mongo-driver/bson"
	mongodrv "go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.uber.org/goleak"

	"github.com/leaderfeed/leaderfeed/internal/testenv"
)

// TestMain tears down the shared real server (if one was used) and then
// fails the run on leaked goroutines.
func TestMain(m *testing.M) {
	code := m.Run()
	shared.teardown()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// testDB is the database the real-server tests use.
const testDB = "leaderfeed_test"

// server is the store one test runs against: lungo (an engine per test) or
// a real server (shared, a collection per test).
type server struct {
	kind string             // "lungo" or "LEADERFEED_MONGO_URL"
	db   lungo.IDatabase    // the database the backends use
	drv  *mongodrv.Database // the real driver's database, nil on lungo
	coll string             // the collection of this test
	eng  *lungo.Engine      // lungo only
}

// realServer is the one real server of the test binary, found once.
type realServer struct {
	once   sync.Once
	kind   string
	client *mongodrv.Client
	err    error
}

var shared realServer

func (r *realServer) find() {
	r.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		url := os.Getenv("LEADERFEED_MONGO_URL")
		if url == "" {
			return // lungo
		}
		r.kind = "LEADERFEED_MONGO_URL"
		opts := options.Client().ApplyURI(url)
		client, err := mongodrv.Connect(ctx, opts)
		if err == nil {
			err = client.Ping(ctx, nil)
		}
		if err != nil {
			r.err = fmt.Errorf("connecting to %s: %w", r.kind, err)
			return
		}
		r.client = client
	})
}

func (r *realServer) teardown() {
	if r.client != nil {
		_ = r.client.Disconnect(context.Background())
	}
}

var collSeq atomic.Int64

// newServer returns the store for one test: the real server when
// LEADERFEED_MONGO_URL is set (the containertest module sets it for a
// container), else a fresh lungo engine.
func newServer(t *testing.T) *server {
	t.Helper()
	shared.find()
	if shared.err != nil {
		testenv.Unavailable(t, "MongoDB: "+shared.err.Error())
	}
	if shared.client == nil {
		return newLungo(t, lungo.Options{})
	}
	coll := fmt.Sprintf("t%d_%d", time.Now().UnixNano()%1e9, collSeq.Add(1))
	db := shared.client.Database(testDB)
	t.Cleanup(func() { _ = db.Collection(coll).Drop(context.Background()) })
	return &server{kind: shared.kind, db: &lungo.MongoDatabase{Database: db}, drv: db, coll: coll}
}

// newLungo returns a server on a fresh lungo engine with opts, closed when
// the test ends.
func newLungo(t *testing.T, opts lungo.Options) *server {
	t.Helper()
	if opts.Store == nil {
		opts.Store = lungo.NewMemoryStore()
	}
	client, eng, err := lungo.Open(context.Background(), opts)
	if err != nil {
		t.Fatalf("lungo.Open: %v", err)
	}
	t.Cleanup(eng.Close)
	return &server{kind: "lungo", db: client.Database(testDB), coll: "elections", eng: eng}
}

// backend opens a backend on s for election, with the test's collection.
func (s *server) backend(t *testing.T, election string, opts Options) *Backend {
	t.Helper()
	b, err := s.newBackend(election, opts)
	if err != nil {
		t.Fatalf("new backend: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func (s *server) newBackend(election string, opts Options) (*Backend, error) {
	if opts.Collection == "" {
		opts.Collection = s.coll
	}
	if s.drv != nil {
		return New(s.drv, election, opts)
	}
	return NewLungo(s.db, election, opts)
}

// collection returns the test's collection, for writes of the test's own.
func (s *server) collection() lungo.ICollection { return s.db.Collection(s.coll) }

// started opens, starts and creates a backend.
func (s *server) started(t *testing.T, election string) *Backend {
	t.Helper()
	b := s.backend(t, election, Options{})
	ctx := testCtx(t)
	if err := b.Start(ctx); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if err := b.Create(ctx); err != nil {
		t.Fatalf("Create: %v", err)
	}
	return b
}

var electionSeq atomic.Int64

// electionName returns an election name unique in the test binary.
func electionName(t *testing.T) string {
	name := strings.NewReplacer("/", "-", " ", "_").Replace(t.Name())
	if len(name) > 100 {
		name = name[:100]
	}
	return fmt.Sprintf("%s-%d", name, electionSeq.Add(1))
}

// testCtx returns a context that ends with the test, or after 20 seconds.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// putDoc writes a user document with key into the test's collection.
func (s *server) putDoc(ctx context.Context, key any, doc bson.M) error {
	_, err := s.collection().ReplaceOne(ctx, bson.M{"_id": key}, doc, options.Replace().SetUpsert(true))
	return err
}
