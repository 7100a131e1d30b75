package rethink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	r "gopkg.in/rethinkdb/rethinkdb-go.v6"
)

// Defaults of Options.
const (
	// DefaultDatabase is the database used when Options.Database is empty.
	DefaultDatabase = "leaderfeed"
	// DefaultTable is the table used when Options.Table is empty.
	DefaultTable = "leaderfeed"
	// MaxTableNameLen is the longest database or table name this package
	// accepts, in bytes.
	MaxTableNameLen = 64
	// tableReadyTimeout bounds how long Create waits for a table to be
	// ready, and how long it retries while the table's primary replica is
	// not available.
	tableReadyTimeout = 30 * time.Second
	// durability is the durability of every write of the election record:
	// acknowledged only once on disk. It overrides a table configured with
	// durability "soft".
	durability = "hard"
)

// conflictMarker is the message of the r.Error that the update function
// raises when the stored document is not the expected write.
const conflictMarker = "leaderfeed: revision conflict"

var validName = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// Options configure a Store. The zero value means the documented defaults.
type Options struct {
	// Database is the RethinkDB database. Default DefaultDatabase.
	Database string
	// Table is the table that holds the election documents of every
	// election that uses it, and possibly documents of the caller's own,
	// whose changes the feed reports. Default DefaultTable.
	Table string
	// NoCreate makes Create check that the database and the table exist
	// instead of creating them: it then fails with an error matching
	// base.ErrInvalidConfig if either is missing. Without it (the default),
	// Create creates what is missing. Either way Create resolves duplicate
	// databases or tables of the configured names (see Store.Create).
	NoCreate bool

	// Logger receives what the store has to report besides errors, with
	// fixed messages and attributes: duplicate databases or tables dropped
	// (Warn), a table configured to acknowledge writes it may lose (Warn),
	// system tables it may not read (Warn), retries while the table is not
	// ready (Debug). Default: discard.
	Logger *slog.Logger
}

// Store is the backend.Store (and backend.BatchStore, backend.BatchReader) of one
// RethinkDB table: the election documents of any number of elections,
// keyed by name in the primary key "id", the caller's own documents, and
// one changefeed on the table for all of them. It is safe for concurrent use as package base
// describes; see the package documentation for its guarantees.
//
// A process with many elections shares one Store through base.Elections;
// New gives the Backend of a lone election.
type Store struct {
	session  *r.Session
	db       string
	table    string
	noCreate bool
	log      *slog.Logger

	closed    atomic.Bool
	closeCtx  context.Context
	closeFunc context.CancelFunc
	subs      sync.WaitGroup
}

var (
	_ backend.BatchStore  = (*Store)(nil)
	_ backend.BatchReader = (*Store)(nil)
)

// NewStore returns a Store over session, which the caller owns and which
// the Store never closes. It checks the names and options without touching
// the server; errors match base.ErrInvalidConfig.
func NewStore(session *r.Session, opts Options) (*Store, error) {
	if session == nil {
		return nil, fmt.Errorf("rethink: %w: session is nil", base.ErrInvalidConfig)
	}
	if opts.Database == "" {
		opts.Database = DefaultDatabase
	}
	if opts.Table == "" {
		opts.Table = DefaultTable
	}
	if err := checkName("database", opts.Database); err != nil {
		return nil, err
	}
	if err := checkName("table", opts.Table); err != nil {
		return nil, err
	}
	if opts.Database == "rethinkdb" {
		return nil, fmt.Errorf("rethink: %w: the database %q is RethinkDB's system database", base.ErrInvalidConfig, opts.Database)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Store{
		session:   session,
		db:        opts.Database,
		table:     opts.Table,
		noCreate:  opts.NoCreate,
		log:       log,
		closeCtx:  ctx,
		closeFunc: cancel,
	}, nil
}

// New returns the Backend of one election over session (base.Open on a
// Store of its own): for a process with one election, whose Feed owns it.
// Closing the Backend closes the Store, never the session. It checks the
// names and options without touching the server; errors match
// base.ErrInvalidConfig.
func New(session *r.Session, election string, opts Options) (backend.Election, error) {
	if err := heartbeat.ValidateName("election name", election); err != nil {
		return nil, fmt.Errorf("rethink: %w: %w", base.ErrInvalidConfig, err)
	}
	s, err := NewStore(session, opts)
	if err != nil {
		return nil, err
	}
	b, err := base.Open(s, election)
	if err != nil {
		return nil, fmt.Errorf("rethink: %w", err)
	}
	return b, nil
}

func checkName(what, name string) error {
	switch {
	case len(name) > MaxTableNameLen:
		return fmt.Errorf("rethink: %w: %s name %q is %d bytes long, longer than %d", base.ErrInvalidConfig, what, name, len(name), MaxTableNameLen)
	case !validName.MatchString(name):
		return fmt.Errorf("rethink: %w: %s name %q must match ^[A-Za-z0-9_-]+$", base.ErrInvalidConfig, what, name)
	}
	return nil
}

// Database returns the database the store uses.
func (s *Store) Database() string { return s.db }

// Table returns the table the store uses.
func (s *Store) Table() string { return s.table }

func (s *Store) term() r.Term { return r.DB(s.db).Table(s.table) }

// check returns an error when the store is closed or ctx is done.
func (s *Store) check(ctx context.Context) error {
	if s.closed.Load() {
		return fmt.Errorf("rethink: %s.%s: %w", s.db, s.table, base.ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("rethink: %s.%s: %w", s.db, s.table, err)
	}
	return nil
}

// wrap adds context to a driver error. A done ctx wins: the driver reports
// a cancelled query as a timeout of its own. Two answers of a real server
// get a hint: a table without a primary replica (for about a second after a
// restart) is transient, and the Feed retries every call as usual; an
// ambiguous name means duplicate databases or tables, which Create
// resolves.
func (s *Store) wrap(ctx context.Context, what string, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("rethink: %s: %w", what, cerr)
	}
	if s.closed.Load() {
		return fmt.Errorf("rethink: %s: %w (%v)", what, base.ErrClosed, err)
	}
	switch {
	case unavailable(err):
		return fmt.Errorf("rethink: %s: %w (transient: the table is not ready yet, as after a server restart)", what, err)
	case ambiguous(err):
		return fmt.Errorf("rethink: %s: %w (duplicate databases or tables of one name: Create resolves them)", what, err)
	}
	return s.refusal("rethink: "+what, err)
}

// refusal wraps err with what and, when the server refused in a way that
// retrying cannot fix, with base.ErrRefused and the fix: credentials the
// server rejects (r.RQLAuthError), a user without the permission
// (RethinkDB's permission error, "User `u` does not have the required
// `write` permission"; driver v6 gives it as an r.RQLRuntimeError), a
// database or table that does not exist. Every other error is transient,
// including a table without its primary replica (see unavailable).
func (s *Store) refusal(what string, err error) error {
	var fix string
	switch msg := err.Error(); {
	case errors.As(err, new(r.RQLAuthError)):
		fix = "the user and password of the connection"
	case strings.Contains(msg, "does not have the required"):
		fix = fmt.Sprintf("as admin, r.db(%q).table(%q).grant(USER, {read: true, write: true})", s.db, s.table)
	case missingRE.MatchString(msg):
		fix = fmt.Sprintf("let Create make it (NoCreate unset), or create it as admin (r.dbCreate(%q), r.db(%q).tableCreate(%q))",
			s.db, s.db, s.table)
	default:
		return fmt.Errorf("%s: %w", what, err)
	}
	return fmt.Errorf("%s: %w: %w; fix: %s", what, base.ErrRefused, err, fix)
}

// missingRE matches the server's words for a missing database or table.
var missingRE = regexp.MustCompile("(Database|Table) `[^`]*` does not exist")

// run runs q with ctx and returns the first raw response, as the server sent
// it (pseudo-types unconverted).
func (s *Store) run(ctx context.Context, what string, q r.Term) (json.RawMessage, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	cur, err := q.Run(s.session, r.RunOpts{Context: ctx})
	if err != nil {
		return nil, s.wrap(ctx, what, err)
	}
	defer cur.Close()
	raw, ok := cur.NextResponse()
	if !ok {
		err := cur.Err()
		if err == nil {
			err = errors.New("empty response")
		}
		return nil, s.wrap(ctx, what, err)
	}
	return raw, nil
}

// Start checks that the session reaches a server that answers queries.
func (s *Store) Start(ctx context.Context) error {
	raw, err := s.run(ctx, "start: checking the server", r.Expr(1))
	if err != nil {
		return err
	}
	if string(raw) != "1" {
		return fmt.Errorf("rethink: start: the server answered r.expr(1) with %s", raw)
	}
	return nil
}

// checkElection checks that election can key a document: a valid name
// (package heartbeat), which also keeps within RethinkDB's primary key
// limit of 127 bytes.
func checkElection(election string) error {
	if err := heartbeat.ValidateName("election name", election); err != nil {
		return fmt.Errorf("rethink: %w: %w", base.ErrInvalidConfig, err)
	}
	return nil
}

// Get returns the current record of election.
func (s *Store) Get(ctx context.Context, election string) (heartbeat.Record, error) {
	if err := checkElection(election); err != nil {
		return heartbeat.Record{}, err
	}
	raw, err := s.run(ctx, "get "+election, s.term().Get(election))
	if err != nil {
		return heartbeat.Record{}, err
	}
	if isNull(raw) {
		return heartbeat.Record{}, s.notFound(election)
	}
	return decodeRecord(election, raw)
}

func (s *Store) notFound(election string) error {
	return fmt.Errorf("rethink: election %q in %s.%s: %w", election, s.db, s.table, backend.ErrNotFound)
}

type writeResult struct {
	Errors     int    `json:"errors"`
	Inserted   int    `json:"inserted"`
	Replaced   int    `json:"replaced"`
	Skipped    int    `json:"skipped"`
	FirstError string `json:"first_error"`
	Changes    []struct {
		NewVal json.RawMessage `json:"new_val"`
	} `json:"changes"`
}

// checkWrite validates a compare-and-set before any I/O: next names its
// election and passes heartbeat.Record.Validate, and the numbers are exact
// in a JSON number. Errors match base.ErrInvalidConfig and
// heartbeat.ErrInvalidRecord.
func checkWrite(expected, next heartbeat.Record) error {
	if err := heartbeat.ValidateWrite(expected, next, maxExact); err != nil {
		return fmt.Errorf("rethink: heartbeat: %w: %w", base.ErrInvalidConfig, err)
	}
	return nil
}

// describe names a write in errors.
func describe(expected, next heartbeat.Record) string {
	what := fmt.Sprintf("heartbeat of %q on revision %d", next.Election, expected.Revision)
	if expected.Revision != 0 {
		what += fmt.Sprintf(" (leader %q, term %d)", expected.Leader, expected.Term)
	}
	return what
}

// Heartbeat is the compare-and-set write of the record next.Election: an
// insert with conflict "error" when expected.Revision is 0, else one atomic
// single-document update whose function checks that the stored document
// is a well-formed election document holding the write expected names (the
// same revision, leader and term) and raises an error otherwise. The
// timestamp is the server's r.Now(); the lease is stored in whole
// microseconds, rounded up. A refused write is followed by a Get to return
// a *backend.ConflictError with the current record, or an error matching
// backend.ErrMalformedRecord when the stored document is foreign or malformed
// (it is never overwritten).
func (s *Store) Heartbeat(ctx context.Context, expected, next heartbeat.Record) (heartbeat.Record, error) {
	if err := s.check(ctx); err != nil {
		return heartbeat.Record{}, err
	}
	if err := checkWrite(expected, next); err != nil {
		return heartbeat.Record{}, err
	}
	election := next.Election
	doc := encodeRecord(election, expected.Revision+1, next)
	var q r.Term
	if expected.Revision == 0 {
		q = s.term().Insert(doc, r.InsertOpts{Conflict: "error", ReturnChanges: true, Durability: durability})
	} else {
		delete(doc, fieldID)
		q = s.term().Get(election).Update(func(row r.Term) any {
			return r.Branch(casCondition(row, r.Expr(expected.Revision), r.Expr(expected.Leader), r.Expr(expected.Term)), doc, r.Error(conflictMarker))
		}, r.UpdateOpts{ReturnChanges: true, Durability: durability})
	}
	what := describe(expected, next)
	raw, err := s.run(ctx, what, q)
	if err != nil {
		return heartbeat.Record{}, err
	}
	var wr writeResult
	if err := json.Unmarshal(raw, &wr); err != nil {
		return heartbeat.Record{}, fmt.Errorf("rethink: %s: cannot decode the write result %.200s: %w", what, raw, err)
	}
	if wr.Errors == 0 && wr.Inserted+wr.Replaced == 1 && len(wr.Changes) == 1 {
		rec, err := decodeRecord(election, wr.Changes[0].NewVal)
		if err != nil {
			return heartbeat.Record{}, fmt.Errorf("rethink: %s: the stored record: %w", what, err)
		}
		return rec, nil
	}
	if wr.Errors == 0 && wr.Skipped != 1 {
		return heartbeat.Record{}, fmt.Errorf("rethink: %s: unexpected write result %.300s", what, raw)
	}
	// Refused: a duplicate primary key (insert), no document (skipped), or
	// the update function raised conflictMarker. Read what is there to tell
	// a conflict from a malformed document.
	cur, err := s.Get(ctx, election)
	return refused(what, wr.FirstError, expected, next, cur, err)
}

// refused returns the outcome of a write the server refused, given what a
// read found after it: cur, or err (ErrNotFound, ErrMalformedRecord, or a
// failure of the read).
func refused(what, firstError string, expected, next, cur heartbeat.Record, err error) (heartbeat.Record, error) {
	switch {
	case errors.Is(err, backend.ErrNotFound):
		return heartbeat.Record{}, fmt.Errorf("rethink: %s: %w", what, backend.NewConflict(heartbeat.Record{Election: next.Election}))
	case errors.Is(err, backend.ErrMalformedRecord):
		return heartbeat.Record{}, fmt.Errorf("rethink: %s: refused to overwrite a foreign or malformed document: %w", what, err)
	case err != nil:
		return heartbeat.Record{}, fmt.Errorf("rethink: %s: refused, and reading the current record failed: %w", what, err)
	case ownWrite(cur, expected, next):
		// The driver retried the query after losing the reply of the first
		// try, which had written this very record.
		return cur, nil
	case expected.Revision == 0 || !cur.SameWrite(expected):
		return heartbeat.Record{}, fmt.Errorf("rethink: %s: %w", what, backend.NewConflict(cur))
	}
	return heartbeat.Record{}, fmt.Errorf("rethink: %s: the server refused the write (%s) though that write is stored: %v", what, firstError, cur)
}

// casCondition is true when the stored document row is a well-formed
// election document holding the write named by revision, leader and term
// (heartbeat.Record.SameWrite), compared by the server inside the update
// function, so the compare-and-set stays one atomic operation per
// document. It is at least as strict as decodeRecord, so that a
// compare-and-set never overwrites a foreign or malformed document. The one
// check it cannot make exactly is the length of the leader id, counted here
// in characters instead of bytes.
func casCondition(row, revision, leader, term r.Term) r.Term {
	storedLeader := row.Field(fieldLeader).Default(nil)
	storedTerm := row.Field(fieldTerm).Default(nil)
	value := row.Field(fieldValue).Default(nil)
	lease := row.Field(fieldLease).Default(nil)
	successor := row.Field(fieldSuccessor).Default(nil)
	handover := row.Field(fieldHandover).Default(nil)
	incarnation := row.Field(fieldIncarnation).Default(nil)
	return r.And(
		row.Field(fieldMark).Default(nil).Eq(formatVersion),
		row.Field(fieldRevision).Default(nil).Eq(revision),
		row.Field(fieldTimestamp).Default(nil).TypeOf().Eq("PTYPE<TIME>"),
		storedLeader.TypeOf().Eq("STRING"),
		storedLeader.Eq(leader),
		storedLeader.Match(`^[^\x00-\x1f\x7f]{0,127}$`).Ne(nil),
		storedTerm.TypeOf().Eq("NUMBER"),
		storedTerm.Eq(term),
		storedTerm.Ge(0), storedTerm.Le(maxExact), storedTerm.Floor().Eq(storedTerm),
		r.Or(value.TypeOf().Eq("NULL"),
			r.And(value.TypeOf().Eq("PTYPE<BINARY>"), value.Count().Le(heartbeat.MaxValueLen), storedLeader.Ne(""))),
		// Missing or null: written before the field existed.
		r.Or(lease.TypeOf().Eq("NULL"),
			r.And(lease.TypeOf().Eq("NUMBER"), lease.Ge(0), lease.Le(heartbeat.MaxLeaseMicros), lease.Floor().Eq(lease))),
		// Missing or null: written before the field existed; ignored on a
		// led record (see decodeRecord).
		r.Or(successor.TypeOf().Eq("NULL"),
			r.And(successor.TypeOf().Eq("STRING"),
				r.Or(storedLeader.Ne(""), successor.Match(`^[^\x00-\x1f\x7f]{0,127}$`).Ne(nil)))),
		// Missing or null: written before the field existed. Range-checked
		// on a vacant record too, as heartbeat.Decode does before it drops
		// the token there.
		r.Or(handover.TypeOf().Eq("NULL"),
			r.And(handover.TypeOf().Eq("NUMBER"), handover.Ge(0), handover.Le(heartbeat.MaxToken), handover.Floor().Eq(handover))),
		// Missing or null: written before the field existed. Range-checked
		// on a vacant record too, as heartbeat.Decode does before it drops
		// the incarnation there.
		r.Or(incarnation.TypeOf().Eq("NULL"),
			r.And(incarnation.TypeOf().Eq("NUMBER"), incarnation.Ge(0), incarnation.Le(heartbeat.MaxToken), incarnation.Floor().Eq(incarnation))),
	)
}

// Close marks the store closed, ends its open subscriptions and waits for
// their goroutines. It never closes the session. It is idempotent.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.closeFunc()
	s.subs.Wait()
	return nil
}
