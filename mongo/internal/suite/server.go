// Package suite holds the MongoDB store's tests that need a server: the
// compare-and-set, batches, the change stream, resuming, faults and the
// conformance suite. They run on lungo in package mongo/onlungo (every run, CI
// included) and on a real server through the driver-v2 adapter in package
// mongo when LEADERFEED_MONGO_URL is set.
package suite

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/mongo"
	"github.com/leaderfeed/leaderfeed/mongo/internal/driver"
)

// Server is the store one test runs against, with a collection of its own.
type Server struct {
	// Kind names the store in logs ("lungo", "LEADERFEED_MONGO_URL").
	Kind string
	// Real is true for a real server: update events are completed with
	// the document as it is when the stream reads them (updateLookup), so
	// revisions may be skipped.
	Real bool
	// Coll is the test's collection.
	Coll string
	// Open returns the adapter of the collection name.
	Open func(name string) driver.Collection
	// The test's own writes to Coll.
	Put    func(ctx context.Context, key any, doc bson.M) error // replace or insert
	Insert func(ctx context.Context, doc bson.M) error
	Update func(ctx context.Context, key any, update bson.M) error
	Delete func(ctx context.Context, key any) error
	Drop   func(ctx context.Context) error
	// Transaction runs fn in a transaction of a session of the
	// collection's client (fn's ctx carries it) and commits it when fn
	// returns nil; nil when the server runs no transactions.
	Transaction func(ctx context.Context, fn func(ctx context.Context) error) error

	mu      sync.Mutex
	faulted map[*mongo.Store]*faulty
}

// NewServer returns the store for one test.
type NewServer func(t *testing.T) *Server

// Run runs every test of the suite on the stores newServer returns.
func Run(t *testing.T, newServer NewServer) {
	for _, c := range []struct {
		name string
		f    func(*testing.T, NewServer)
	}{
		{"HeartbeatCompareAndSet", testHeartbeatCompareAndSet},
		{"ConcurrentClaimsOneWinner", testConcurrentClaimsOneWinner},
		{"Create", testCreate},
		{"StartStandalone", testStartStandalone},
		{"CanceledContext", testCanceledContext},
		{"CloseIdempotent", testCloseIdempotent},
		{"MalformedRecord", testMalformedRecord},
		{"Lease", testLease},
		{"SubscribeInOrder", testSubscribeInOrder},
		{"ResumeAfterStreamClosed", testResumeAfterStreamClosed},
		{"ResumeTokenLost", testResumeTokenLost},
		{"ResumeWithoutToken", testResumeWithoutToken},
		{"EventTooLarge", testEventTooLarge},
		{"HugeDocumentDelivered", testHugeDocumentDelivered},
		{"DropCollection", testDropCollection},
		{"TwoStoresSeeEachOther", testTwoStoresSeeEachOther},
		{"OneStreamManyElections", testOneStreamManyElections},
		{"HeartbeatBatch", testHeartbeatBatch},
		{"BatchDuplicateElection", testBatchDuplicateElection},
		{"FeedStreamResumedWithoutLoss", testFeedStreamResumedWithoutLoss},
		{"FeedMalformedRecordIgnored", testFeedMalformedRecordIgnored},
		{"FeedHugeDocument", testFeedHugeDocument},
		{"FeedTwoNodes", testFeedTwoNodes},
		{"Fence", testFence},
		{"PresenceJoined", testPresenceJoined},
		{"Conformance", testConformance},
	} {
		t.Run(c.name, func(t *testing.T) { c.f(t, newServer) })
	}
}

// node is one election on a Store of its own, as the store tests drive
// it: the Store's verbs bound to the election, and its changefeed filtered
// to the election's records and the other documents.
type node struct {
	*mongo.Store
	election string
}

func (n *node) Name() string { return n.election }

func (n *node) Get(ctx context.Context) (heartbeat.Record, error) {
	return n.Store.Get(ctx, n.election)
}

func (n *node) Heartbeat(ctx context.Context, expected, next heartbeat.Record) (heartbeat.Record, error) {
	if next.Election == "" {
		next.Election = n.election
	}
	return n.Store.Heartbeat(ctx, expected, next)
}

// Subscribe returns the Store's changefeed without the notifications of
// other elections. The channel closes when the Store's does.
func (n *node) Subscribe(ctx context.Context) (<-chan backend.Notification, error) {
	in, err := n.Store.Subscribe(ctx)
	if err != nil {
		return nil, err
	}
	out := make(chan backend.Notification)
	go func() {
		defer close(out)
		for m := range in {
			if m.Type == backend.RecordChanged && m.Record.Election != n.election ||
				(m.Type == backend.RecordDeleted || m.Type == backend.Ignored) && m.Election != n.election {
				continue
			}
			select {
			case out <- m:
			case <-ctx.Done():
				for range in {
				}
				return
			}
		}
	}()
	return out, nil
}

// store opens a Store on s (opts.Collection defaults to the test's),
// closed when the test ends.
func (s *Server) store(t *testing.T, opts mongo.Options) *mongo.Store {
	t.Helper()
	st, err := s.newStore(opts)
	if err != nil {
		t.Fatalf("new store: %v", err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// backend opens a Store of its own for election, closed when the test
// ends.
func (s *Server) backend(t *testing.T, election string, opts mongo.Options) *node {
	t.Helper()
	return &node{Store: s.store(t, opts), election: election}
}

// feedBackend returns the backend.Election of election on a Store of its own
// (base.Open), and the Store, for the fault injection.
func (s *Server) feedBackend(t *testing.T, election string, opts mongo.Options) (backend.Election, *mongo.Store) {
	t.Helper()
	st := s.store(t, opts)
	b, err := base.Open(st, election)
	if err != nil {
		t.Fatalf("base.Open: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b, st
}

// newBackend opens the backend.Election of election on a Store of its own.
func (s *Server) newBackend(election string, opts mongo.Options) (backend.Election, error) {
	st, err := s.newStore(opts)
	if err != nil {
		return nil, err
	}
	b, err := base.Open(st, election)
	if err != nil {
		_ = st.Close()
		return nil, err
	}
	return b, nil
}

// newStore opens a Store on the fault-injecting wrapper of the collection
// opts.Collection (default: the test's).
func (s *Server) newStore(opts mongo.Options) (*mongo.Store, error) {
	if opts.Collection == "" {
		opts.Collection = s.Coll
	}
	f := &faulty{Collection: s.Open(opts.Collection)}
	v, err := driver.NewStore(f, opts)
	if err != nil {
		return nil, err
	}
	st := v.(*mongo.Store)
	s.mu.Lock()
	if s.faulted == nil {
		s.faulted = map[*mongo.Store]*faulty{}
	}
	s.faulted[st] = f
	s.mu.Unlock()
	return st, nil
}

func (s *Server) faults(st *mongo.Store) *faulty {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.faulted[st]
}

// started opens, starts and creates a Store for election.
func (s *Server) started(t *testing.T, election string) *node {
	t.Helper()
	b := s.backend(t, election, mongo.Options{})
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
		name = name[len(name)-100:]
	}
	return fmt.Sprintf("%s-%d", name, electionSeq.Add(1))
}

// testCtx returns a context that ends with the test, or after 20 seconds.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// errKilled is what a stream killed by the test fails with.
var errKilled = errors.New("change stream killed by the test")

// faulty wraps a collection adapter to inject what a server or network
// failure would do.
type faulty struct {
	driver.Collection

	mu         sync.Mutex
	streams    map[*faultyStream]struct{}
	token      bson.Raw // non-nil: the next Watch resumes from it instead
	hideTokens bool     // streams give no resume tokens
	hello      bson.Raw // non-nil: Hello answers this
}

func (f *faulty) Hello(ctx context.Context) (bson.Raw, error) {
	f.mu.Lock()
	hello := f.hello
	f.mu.Unlock()
	if hello != nil {
		return hello, nil
	}
	return f.Collection.Hello(ctx)
}

func (f *faulty) Watch(ctx context.Context, resumeAfter bson.Raw) (driver.Stream, error) {
	f.mu.Lock()
	if f.token != nil && resumeAfter != nil {
		resumeAfter, f.token = f.token, nil
	}
	f.mu.Unlock()
	inner, err := f.Collection.Watch(ctx, resumeAfter)
	if err != nil {
		return nil, err
	}
	s := &faultyStream{inner: inner, f: f, killed: make(chan struct{})}
	f.mu.Lock()
	if f.streams == nil {
		f.streams = map[*faultyStream]struct{}{}
	}
	f.streams[s] = struct{}{}
	f.mu.Unlock()
	return s, nil
}

// kill makes the open streams fail with err, as a broken connection or a
// server error would.
func (f *faulty) kill(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for s := range f.streams {
		s.once.Do(func() { s.err = err; close(s.killed) })
	}
}

type faultyStream struct {
	inner  driver.Stream
	f      *faulty
	once   sync.Once
	killed chan struct{}
	err    error
}

func (s *faultyStream) Next(ctx context.Context) (bson.Raw, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-s.killed:
			cancel()
		case <-ctx.Done():
		}
	}()
	ev, err := s.inner.Next(ctx)
	select {
	case <-s.killed:
		return nil, s.err
	default:
	}
	return ev, err
}

func (s *faultyStream) ResumeToken() bson.Raw {
	s.f.mu.Lock()
	hide := s.f.hideTokens
	s.f.mu.Unlock()
	if hide {
		return nil
	}
	return s.inner.ResumeToken()
}

func (s *faultyStream) Close(ctx context.Context) error {
	s.f.mu.Lock()
	delete(s.f.streams, s)
	s.f.mu.Unlock()
	return s.inner.Close(ctx)
}
