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
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/mongo/internal/driver"
)

// DefaultCollection is the collection the election documents are kept in
// when Options.Collection is empty.
const DefaultCollection = "leaderfeed"

// Options configures a Store. The zero value is ready to use.
type Options struct {
	// Collection is the collection that holds the election documents (and
	// may hold documents of the caller's own). Default DefaultCollection.
	Collection string

	// NoCreate makes Create check that the collection exists instead of
	// creating it. Without it, Create creates the collection if it is
	// missing.
	NoCreate bool

	// Logger receives what the store has to report besides errors: a gap
	// in the change stream (resume token no longer valid). Default: discard.
	Logger *slog.Logger
}

// Store is the MongoDB store of leaderfeed: one collection holding any
// number of election documents (keyed by _id, the election name) beside
// documents of the caller's own, and one change stream on it. It
// implements backend.Store and backend.BatchStore; base.NewElections shares it
// among the elections of a process, and New gives the Backend of a lone
// election. All methods are safe for concurrent use.
type Store struct {
	coll     driver.Collection
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
	// elections are the _ids known to be election documents: seen with
	// the mark, or named by a Get or Heartbeat of this store. A document
	// without the mark under one of them is a malformed record (Ignored),
	// and its deletion is the record's (RecordDeleted); under any other
	// _id it is the caller's (OtherChanged).
	elections map[string]struct{}
}

var (
	_ backend.BatchStore  = (*Store)(nil)
	_ backend.BatchReader = (*Store)(nil)
)

// NewStore returns the store of the collection Options.Collection of db (a
// *mongo.Database of go.mongodb.org/mongo-driver/v2). The caller owns db's
// client: the store never disconnects it. NewStore checks the names (errors
// match base.ErrInvalidConfig) but does no I/O; Start checks the server.
//
// The elections' reads and writes use majority read and write concern and
// the primary, whatever db's own settings are.
func NewStore(db *mongodrv.Database, opts Options) (*Store, error) {
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
	return newStore(newV2Collection(db.Collection(collName)), opts), nil
}

// NewCollectionStore is NewStore for a *mongo.Collection of
// go.mongodb.org/mongo-driver/v2: the election documents are kept in coll.
// Options.Collection must be empty or coll's name.
func NewCollectionStore(coll *mongodrv.Collection, opts Options) (*Store, error) {
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
	return newStore(newV2Collection(coll), opts), nil
}

// New returns the backend of the one election named election, kept in the
// collection Options.Collection of db: base.Open on a NewStore of its own,
// which closing the backend closes. A process with many elections makes one
// Store and shares it with base.NewElections.
func New(db *mongodrv.Database, election string, opts Options) (backend.Election, error) {
	if err := validElection(election); err != nil {
		return nil, err
	}
	s, err := NewStore(db, opts)
	if err != nil {
		return nil, err
	}
	return open(s, election)
}

// NewCollection is New for a *mongo.Collection of
// go.mongodb.org/mongo-driver/v2 (see NewCollectionStore).
func NewCollection(coll *mongodrv.Collection, election string, opts Options) (backend.Election, error) {
	if err := validElection(election); err != nil {
		return nil, err
	}
	s, err := NewCollectionStore(coll, opts)
	if err != nil {
		return nil, err
	}
	return open(s, election)
}

func open(s *Store, election string) (backend.Election, error) {
	b, err := base.Open(s, election)
	if err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("mongo: %w", err)
	}
	return b, nil
}

func init() {
	driver.NewStore = func(c driver.Collection, opts any) (any, error) {
		o, _ := opts.(Options)
		if c == nil {
			return nil, fmt.Errorf("mongo: %w: nil collection", base.ErrInvalidConfig)
		}
		if err := validateNames(c.DatabaseName(), c.Name()); err != nil {
			return nil, err
		}
		return newStore(c, o), nil
	}
}

func newStore(coll driver.Collection, opts Options) *Store {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Store{
		coll:        coll,
		collName:    coll.Name(),
		noCreate:    opts.NoCreate,
		log:         log.With("collection", coll.Name()),
		closeCtx:    ctx,
		closeCancel: cancel,
		subs:        map[*subscription]struct{}{},
		elections:   map[string]struct{}{},
	}
}

// validElection checks an election name, the _id of its document.
func validElection(election string) error {
	if err := heartbeat.ValidateName("election name", election); err != nil {
		return fmt.Errorf("mongo: %w: %w", base.ErrInvalidConfig, err)
	}
	return nil
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

// Collection returns the name of the collection that holds the election
// documents.
func (s *Store) Collection() string { return s.collName }

// check returns an error when the store is closed or ctx is done.
func (s *Store) check(ctx context.Context, what string) error {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return fmt.Errorf("mongo: %s: %w", what, base.ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("mongo: %s: %w", what, err)
	}
	return nil
}

// opError wraps err of the operation what, so that it matches ctx.Err()
// when ctx ended during the call (the drivers do not always say so), and
// so that a refusal matches base.ErrRefused (see refusal).
func (s *Store) opError(ctx context.Context, what string, err error) error {
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("mongo: %s: %w (%v)", what, cerr, err)
	}
	return s.refusal("mongo: "+what, err)
}

// refusal wraps err with what and, when the server refused (the user may
// not run the command, or the credentials are wrong: the adapter's
// driver.ErrUnauthorized and driver.ErrAuthFailed), with base.ErrRefused
// and the fix. Every other error is transient.
func (s *Store) refusal(what string, err error) error {
	switch {
	case errors.Is(err, driver.ErrUnauthorized):
		return fmt.Errorf("%s: %w: %w; fix: grant the user the readWrite role on database %q "+
			"(db.grantRolesToUser(USER, [{role: \"readWrite\", db: %q}]))", what, base.ErrRefused, err, s.coll.DatabaseName(), s.coll.DatabaseName())
	case errors.Is(err, driver.ErrAuthFailed):
		return fmt.Errorf("%s: %w: %w; fix: the user, password and authSource of the connection string", what, base.ErrRefused, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// know records that election is an election's _id.
func (s *Store) know(election string) {
	s.mu.Lock()
	s.elections[election] = struct{}{}
	s.mu.Unlock()
}

func (s *Store) isElection(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.elections[id]
	return ok
}

// Start checks that the server can run change streams: it runs hello
// (isMaster on servers older than 4.4.2) and fails with an error matching
// backend.ErrUnsupported on a standalone mongod.
func (s *Store) Start(ctx context.Context) error {
	if err := s.check(ctx, "start"); err != nil {
		return err
	}
	hello, err := s.coll.Hello(ctx)
	if err != nil {
		return s.opError(ctx, "start: hello", err)
	}
	if err := checkHello(hello); err != nil {
		return fmt.Errorf("mongo: start: %w", err)
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
		"(a single-node replica set will do: start mongod with --replSet rs0 and run rs.initiate() once)", backend.ErrUnsupported)
}

// Create creates the collection if it is missing, or with Options.NoCreate
// checks that it exists. It is idempotent.
func (s *Store) Create(ctx context.Context) error {
	if err := s.check(ctx, "create"); err != nil {
		return err
	}
	if s.noCreate {
		ok, err := s.coll.Exists(ctx)
		if err != nil {
			return s.opError(ctx, "create: list collections", err)
		}
		if !ok {
			return fmt.Errorf("mongo: create: %w: %w: collection %q does not exist in database %q and NoCreate is set; "+
				"fix: let Create make it (NoCreate unset), or db.createCollection(%q)",
				base.ErrRefused, base.ErrInvalidConfig, s.collName, s.coll.DatabaseName(), s.collName)
		}
		return nil
	}
	if err := s.coll.Create(ctx); err != nil {
		return s.opError(ctx, "create collection "+s.collName, err)
	}
	return nil
}

// Get returns the record of election, or an error matching backend.ErrNotFound
// when there is no document, or backend.ErrMalformedRecord when the document
// with the election's _id is not a valid election record.
func (s *Store) Get(ctx context.Context, election string) (heartbeat.Record, error) {
	what := fmt.Sprintf("election %q: get", election)
	if err := validElection(election); err != nil {
		return heartbeat.Record{}, err
	}
	if err := s.check(ctx, what); err != nil {
		return heartbeat.Record{}, err
	}
	s.know(election)
	return s.get(ctx, election)
}

func (s *Store) get(ctx context.Context, election string) (heartbeat.Record, error) {
	what := fmt.Sprintf("election %q: get", election)
	raw, err := s.coll.FindOne(ctx, election)
	if errors.Is(err, driver.ErrNoDocument) {
		return heartbeat.Record{}, fmt.Errorf("mongo: %s: %w", what, backend.ErrNotFound)
	}
	if err != nil {
		return heartbeat.Record{}, s.opError(ctx, what, err)
	}
	rec, err := decodeRecord(raw, election)
	if err != nil {
		return heartbeat.Record{}, fmt.Errorf("mongo: %s: %w", what, err)
	}
	return rec, nil
}

// write is one compare-and-set, prepared.
type write struct {
	what     string // describes the write in errors
	filter   bson.D
	update   bson.D
	upsert   bool
	expected heartbeat.Record
	next     heartbeat.Record
}

// prepare checks a write and builds its filter and update.
func prepare(expected, next heartbeat.Record) (write, error) {
	if err := heartbeat.ValidateWrite(expected, next, math.MaxInt64); err != nil {
		return write{}, fmt.Errorf("mongo: election %q: heartbeat: %w: %w", next.Election, base.ErrInvalidConfig, err)
	}
	value := next.Value
	if value == nil {
		value = []byte{}
	}
	filter := bson.D{
		{Key: "_id", Value: next.Election},
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
			{Key: fieldLease, Value: heartbeat.LeaseMicros(next.Lease)},
			{Key: fieldSuccessor, Value: next.Successor},
			{Key: fieldHandover, Value: int64(next.Handover)},
			{Key: fieldIncarnation, Value: int64(next.Incarnation)},
		}},
		{Key: "$inc", Value: bson.D{{Key: fieldRevision, Value: int64(1)}}},
		{Key: "$currentDate", Value: bson.D{{Key: fieldTimestamp, Value: true}}},
	}
	what := fmt.Sprintf("election %q: heartbeat on revision %d", next.Election, expected.Revision)
	if expected.Revision != 0 {
		what += fmt.Sprintf(" (leader %q, term %d)", expected.Leader, expected.Term)
	}
	return write{what: what, filter: filter, update: update, upsert: expected.Revision == 0, expected: expected, next: next}, nil
}

// refused returns the error of a write that was refused, given the
// document now in its place (nil: none): a *backend.ConflictError with the
// current record, or an error matching backend.ErrMalformedRecord.
func (w write) refused(doc bson.Raw) error {
	if doc == nil {
		return fmt.Errorf("mongo: %s: %w", w.what, backend.NewConflict(heartbeat.Record{Election: w.next.Election}))
	}
	cur, err := decodeRecord(doc, w.next.Election)
	if err != nil {
		// No record to carry in a *ConflictError: report the malformed
		// document (nothing was written).
		return fmt.Errorf("mongo: %s refused, the document in the way is malformed: %w", w.what, err)
	}
	return fmt.Errorf("mongo: %s: %w", w.what, backend.NewConflict(cur))
}

// Heartbeat is the compare-and-set write of the record next.Election: one
// FindOneAndUpdate with the filter {_id, leaderfeed: 1, revision:
// expected.Revision, leader: expected.Leader, term: expected.Term} (the
// write's identity, heartbeat.Record.SameWrite), or an upsert with the
// filter {_id, leaderfeed: 1, revision: 0} when expected.Revision is 0. The
// lease is stored in whole microseconds, rounded up. A write that matches
// nothing, or an upsert that loses to an existing document (duplicate key),
// returns a *backend.ConflictError with the current record. When the document
// with the election's _id is malformed, nothing is written either, and the
// error matches backend.ErrMalformedRecord instead (there is no record to
// carry).
func (s *Store) Heartbeat(ctx context.Context, expected, next heartbeat.Record) (heartbeat.Record, error) {
	w, err := prepare(expected, next)
	if err != nil {
		return heartbeat.Record{}, err
	}
	if err := s.check(ctx, fmt.Sprintf("election %q: heartbeat", next.Election)); err != nil {
		return heartbeat.Record{}, err
	}
	s.know(next.Election)
	raw, err := s.coll.FindOneAndUpdate(ctx, w.filter, w.update, w.upsert)
	switch {
	case err == nil:
		rec, err := decodeRecord(raw, next.Election)
		if err != nil { // cannot happen unless someone rewrote it at once
			return heartbeat.Record{}, fmt.Errorf("mongo: %s: written, but: %w", w.what, err)
		}
		return rec, nil
	case errors.Is(err, driver.ErrNoDocument), errors.Is(err, driver.ErrDuplicateKey):
		// Lost: nothing matched, or the upsert's insert hit the existing
		// document. Report what is there now.
		doc, gerr := s.coll.FindOne(ctx, next.Election)
		switch {
		case gerr == nil:
			return heartbeat.Record{}, w.refused(doc)
		case errors.Is(gerr, driver.ErrNoDocument):
			return heartbeat.Record{}, w.refused(nil)
		default:
			return heartbeat.Record{}, s.opError(ctx, w.what+" lost, then get", gerr)
		}
	default:
		return heartbeat.Record{}, s.opError(ctx, w.what, err)
	}
}

// Close ends the open subscriptions and waits for their goroutines. It
// never disconnects the caller's client. It is idempotent; afterwards every
// method returns an error matching base.ErrClosed.
func (s *Store) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.closeCancel()
	s.wg.Wait()
	return nil
}
