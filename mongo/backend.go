package mongo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"

	"go.mongodb.org/mongo-driver/v2/bson"
	mongodrv "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/mongo/internal/driver"
)

// DefaultCollection is the collection the election documents are kept in
// when Options.Collection is empty.
const DefaultCollection = "leaderfeed"

// Options configures a Backend. The zero value is ready to use.
type Options struct {
	// Collection is the collection that holds the election document (and
	// may hold documents of the caller's own). Default DefaultCollection.
	Collection string

	// NoCreate makes Create check that the collection exists instead of
	// creating it. Without it, Create creates the collection if it is
	// missing.
	NoCreate bool

	// Logger receives what the backend has to report besides errors: a gap
	// in the change stream (resume token no longer valid). Default: discard.
	Logger *slog.Logger
}

// Backend is the MongoDB backend of one election. It implements
// base.Backend. All methods are safe for concurrent use.
type Backend struct {
	coll     driver.Collection
	election string
	collName string
	noCreate bool
	log      *slog.Logger

	closeCtx    context.Context // cancelled by Close; ends subscriptions
	closeCancel context.CancelFunc
	wg          sync.WaitGroup // subscription goroutines

	mu     sync.Mutex
	closed bool
	token  bson.Raw // resume token after the last event delivered
	opened bool     // a change stream has been opened before
	subs   map[*subscription]struct{}
}

var _ base.Backend = (*Backend)(nil)

// New returns a backend for the election named election, kept in the
// collection Options.Collection of db (a *mongo.Database of
// go.mongodb.org/mongo-driver/v2). The caller owns db's client: the backend
// never disconnects it. New checks the names (errors match
// base.ErrInvalidConfig) but does no I/O; Start checks the server.
//
// The election's reads and writes use majority read and write concern and
// the primary, whatever db's own settings are.
func New(db *mongodrv.Database, election string, opts Options) (*Backend, error) {
	if db == nil {
		return nil, fmt.Errorf("mongo: %w: nil database", base.ErrInvalidConfig)
	}
	collName := opts.Collection
	if collName == "" {
		collName = DefaultCollection
	}
	if err := validateNames(db.Name(), collName); err != nil {
		return nil, err
	}
	return newBackend(newV2Collection(db.Collection(collName)), election, opts)
}

// NewCollection is New for a *mongo.Collection of
// go.mongodb.org/mongo-driver/v2: the election documents are kept in coll.
// Options.Collection must be empty or coll's name.
func NewCollection(coll *mongodrv.Collection, election string, opts Options) (*Backend, error) {
	if coll == nil {
		return nil, fmt.Errorf("mongo: %w: nil collection", base.ErrInvalidConfig)
	}
	if opts.Collection != "" && opts.Collection != coll.Name() {
		return nil, fmt.Errorf("mongo: %w: Options.Collection is %q but the collection given is %q",
			base.ErrInvalidConfig, opts.Collection, coll.Name())
	}
	if err := validateNames(coll.Database().Name(), coll.Name()); err != nil {
		return nil, err
	}
	return newBackend(newV2Collection(coll), election, opts)
}

func init() {
	driver.NewBackend = func(c driver.Collection, election string, opts any) (any, error) {
		o, _ := opts.(Options)
		if c == nil {
			return nil, fmt.Errorf("mongo: %w: nil collection", base.ErrInvalidConfig)
		}
		if err := validateNames(c.DatabaseName(), c.Name()); err != nil {
			return nil, err
		}
		b, err := newBackend(c, election, o)
		if err != nil {
			return nil, err
		}
		return b, nil
	}
}

func newBackend(coll driver.Collection, election string, opts Options) (*Backend, error) {
	if err := heartbeat.ValidateName("election name", election); err != nil {
		return nil, fmt.Errorf("mongo: %w: %w", base.ErrInvalidConfig, err)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Backend{
		coll:        coll,
		election:    election,
		collName:    coll.Name(),
		noCreate:    opts.NoCreate,
		log:         log.With("election", election, "collection", coll.Name()),
		closeCtx:    ctx,
		closeCancel: cancel,
		subs:        map[*subscription]struct{}{},
	}, nil
}

// validateNames checks a database and a collection name against MongoDB's
// rules, so that a bad name fails early with a clear error.
func validateNames(dbName, coll string) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("mongo: %w: %s", base.ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case dbName == "":
		return bad("database name is empty")
	case len(dbName) >= 64:
		return bad("database name %q is %d bytes long; MongoDB allows at most 63", dbName, len(dbName))
	case strings.ContainsAny(dbName, "/\\. \"$*<>:|?\x00"):
		return bad("database name %q contains a character MongoDB forbids (one of /\\. \"$*<>:|? or NUL)", dbName)
	case coll == "":
		return bad("collection name is empty")
	case strings.ContainsAny(coll, "$\x00"):
		return bad("collection name %q contains '$' or NUL", coll)
	case strings.HasPrefix(coll, "system."):
		return bad("collection name %q starts with \"system.\", which MongoDB reserves", coll)
	case len(dbName)+1+len(coll) > 255:
		return bad("namespace %q is %d bytes long; MongoDB allows at most 255", dbName+"."+coll, len(dbName)+1+len(coll))
	}
	return nil
}

// Election returns the name of the election.
func (b *Backend) Election() string { return b.election }

// Collection returns the name of the collection that holds the election
// document.
func (b *Backend) Collection() string { return b.collName }

func (b *Backend) errorf(format string, args ...any) error {
	return fmt.Errorf("mongo: election %q: "+format, append([]any{b.election}, args...)...)
}

// check returns an error when the backend is closed or ctx is done.
func (b *Backend) check(ctx context.Context, op string) error {
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		return b.errorf("%s: %w", op, base.ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return b.errorf("%s: %w", op, err)
	}
	return nil
}

// opError wraps err of the operation op, so that it matches ctx.Err() when
// ctx ended during the call (the drivers do not always say so).
func (b *Backend) opError(ctx context.Context, op string, err error) error {
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return b.errorf("%s: %w (%v)", op, cerr, err)
	}
	return b.errorf("%s: %w", op, err)
}

// Start checks that the server can run change streams: it runs hello
// (isMaster on servers older than 4.4.2) and fails with an error matching
// base.ErrUnsupported on a standalone mongod.
func (b *Backend) Start(ctx context.Context) error {
	if err := b.check(ctx, "start"); err != nil {
		return err
	}
	hello, err := b.coll.Hello(ctx)
	if err != nil {
		return b.opError(ctx, "start: hello", err)
	}
	if err := checkHello(hello); err != nil {
		return b.errorf("start: %w", err)
	}
	return nil
}

// checkHello says whether the server that answered hello can run change
// streams: a replica set member or a mongos.
func checkHello(hello bson.Raw) error {
	if msg, ok := hello.Lookup("msg").StringValueOK(); ok && msg == "isdbgrid" {
		return nil // mongos: a sharded cluster
	}
	if set, ok := hello.Lookup("setName").StringValueOK(); ok && set != "" {
		return nil
	}
	return fmt.Errorf("%w: the server is a standalone mongod, and change streams need a replica set or a sharded cluster "+
		"(a single-node replica set will do: start mongod with --replSet rs0 and run rs.initiate() once)", base.ErrUnsupported)
}

// Create creates the collection if it is missing, or with Options.NoCreate
// checks that it exists. It is idempotent.
func (b *Backend) Create(ctx context.Context) error {
	if err := b.check(ctx, "create"); err != nil {
		return err
	}
	if b.noCreate {
		ok, err := b.coll.Exists(ctx)
		if err != nil {
			return b.opError(ctx, "create: list collections", err)
		}
		if !ok {
			return b.errorf("create: %w: collection %q does not exist in database %q and Options.NoCreate is set",
				base.ErrInvalidConfig, b.collName, b.coll.DatabaseName())
		}
		return nil
	}
	if err := b.coll.Create(ctx); err != nil {
		return b.opError(ctx, "create collection "+b.collName, err)
	}
	return nil
}

// Get returns the election record, or an error matching base.ErrNotFound
// when there is no document, or base.ErrMalformedRecord when the document
// with the election's _id is not a valid election record.
func (b *Backend) Get(ctx context.Context) (heartbeat.Record, error) {
	if err := b.check(ctx, "get"); err != nil {
		return heartbeat.Record{}, err
	}
	return b.get(ctx)
}

func (b *Backend) get(ctx context.Context) (heartbeat.Record, error) {
	raw, err := b.coll.FindOne(ctx, b.election)
	if errors.Is(err, driver.ErrNoDocument) {
		return heartbeat.Record{}, b.errorf("get: %w", base.ErrNotFound)
	}
	if err != nil {
		return heartbeat.Record{}, b.opError(ctx, "get", err)
	}
	rec, err := decodeRecord(raw, b.election)
	if err != nil {
		return heartbeat.Record{}, b.errorf("get: %w", err)
	}
	return rec, nil
}

// Heartbeat is the compare-and-set write: one FindOneAndUpdate with the
// filter {_id, leaderfeed: 1, revision: expected.Revision, leader:
// expected.Leader, term: expected.Term} (the write's identity,
// heartbeat.Record.SameWrite), or an upsert with the filter {_id,
// leaderfeed: 1, revision: 0} when expected.Revision is 0. The lease is
// stored in whole microseconds, rounded up. A write that matches nothing,
// or an upsert that loses to an existing document (duplicate key), returns
// a *base.ConflictError with the current record. When the document with the
// election's _id is malformed, nothing is written either, and the error
// matches base.ErrMalformedRecord instead (there is no record to carry).
func (b *Backend) Heartbeat(ctx context.Context, expected, next heartbeat.Record) (heartbeat.Record, error) {
	if err := b.check(ctx, "heartbeat"); err != nil {
		return heartbeat.Record{}, err
	}
	if next.Election == "" {
		next.Election = b.election
	}
	if next.Election != b.election {
		return heartbeat.Record{}, b.errorf("heartbeat: %w: record of election %q", base.ErrInvalidConfig, next.Election)
	}
	if err := next.Validate(); err != nil {
		return heartbeat.Record{}, b.errorf("heartbeat: %w: %w", base.ErrInvalidConfig, err)
	}
	if next.Term > math.MaxInt64 || expected.Term > math.MaxInt64 || expected.Revision >= math.MaxInt64 {
		return heartbeat.Record{}, b.errorf("heartbeat: %w: term %d, expected term %d or expected revision %d does not fit in int64",
			base.ErrInvalidConfig, next.Term, expected.Term, expected.Revision)
	}
	value := next.Value
	if value == nil {
		value = []byte{}
	}
	filter := bson.D{
		{Key: "_id", Value: b.election},
		{Key: fieldMark, Value: int32(1)},
		{Key: fieldRevision, Value: int64(expected.Revision)},
	}
	if expected.Revision != 0 {
		// The write's identity, not the revision alone: a store that lost
		// an acknowledged write (a rollback after a failover) can hand one
		// revision out twice. The upsert of a first write leaves them out:
		// its insert would copy them into the new document.
		filter = append(filter,
			bson.E{Key: fieldLeader, Value: expected.Leader},
			bson.E{Key: fieldTerm, Value: int64(expected.Term)})
	}
	update := bson.D{
		{Key: "$set", Value: bson.D{
			{Key: fieldMark, Value: int32(1)},
			{Key: fieldLeader, Value: next.Leader},
			{Key: fieldTerm, Value: int64(next.Term)},
			{Key: fieldValue, Value: bson.Binary{Data: value}},
			{Key: fieldLease, Value: leaseMicros(next.Lease)},
		}},
		{Key: "$inc", Value: bson.D{{Key: fieldRevision, Value: int64(1)}}},
		{Key: "$currentDate", Value: bson.D{{Key: fieldTimestamp, Value: true}}},
	}
	what := fmt.Sprintf("heartbeat on revision %d", expected.Revision)
	if expected.Revision != 0 {
		what += fmt.Sprintf(" (leader %q, term %d)", expected.Leader, expected.Term)
	}
	raw, err := b.coll.FindOneAndUpdate(ctx, filter, update, expected.Revision == 0)
	switch {
	case err == nil:
		rec, err := decodeRecord(raw, b.election)
		if err != nil { // cannot happen unless someone rewrote it at once
			return heartbeat.Record{}, b.errorf("heartbeat: written, but: %w", err)
		}
		return rec, nil
	case errors.Is(err, driver.ErrNoDocument), errors.Is(err, driver.ErrDuplicateKey):
		// Lost: nothing matched, or the upsert's insert hit the existing
		// document. Report what is there now.
		cur, gerr := b.get(ctx)
		switch {
		case gerr == nil:
			return heartbeat.Record{}, b.errorf("%s: %w", what, base.NewConflict(cur))
		case errors.Is(gerr, base.ErrNotFound):
			return heartbeat.Record{}, b.errorf("%s: %w", what, base.NewConflict(heartbeat.Record{Election: b.election}))
		case errors.Is(gerr, base.ErrMalformedRecord):
			// No record to carry in a *ConflictError: report the
			// malformed document (nothing was written).
			return heartbeat.Record{}, b.errorf("%s refused, the document in the way is malformed: %w", what, errors.Unwrap(gerr))
		default:
			return heartbeat.Record{}, b.errorf("%s lost, then: %w", what, gerr)
		}
	default:
		return heartbeat.Record{}, b.opError(ctx, "heartbeat", err)
	}
}

// Close ends the open subscriptions and waits for their goroutines. It
// never disconnects the caller's client. It is idempotent; afterwards every
// method returns an error matching base.ErrClosed.
func (b *Backend) Close() error {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.closeCancel()
	b.wg.Wait()
	return nil
}
