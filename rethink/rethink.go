package rethink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
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

// Options configure a Backend. The zero value means the documented
// defaults.
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
	// databases or tables of the configured names (see Backend.Create).
	NoCreate bool

	// Logger receives what the backend has to report besides errors, with
	// fixed messages and attributes: duplicate databases or tables dropped
	// (Warn), a table configured to acknowledge writes it may lose (Warn),
	// system tables it may not read (Warn), retries while the table is not
	// ready (Debug). Default: discard.
	Logger *slog.Logger
}

// Backend is a base.Backend over one election in one RethinkDB table. It is
// safe for concurrent use as package base describes; see the package
// documentation for its guarantees.
type Backend struct {
	session  *r.Session
	election string
	db       string
	table    string
	noCreate bool
	log      *slog.Logger

	closed    atomic.Bool
	closeCtx  context.Context
	closeFunc context.CancelFunc
	subs      sync.WaitGroup
}

var _ base.Backend = (*Backend)(nil)

// New returns a Backend for election over session, which the caller owns
// and which the Backend never closes. It checks the names and options
// without touching the server; errors match base.ErrInvalidConfig.
func New(session *r.Session, election string, opts Options) (*Backend, error) {
	if session == nil {
		return nil, fmt.Errorf("rethink: %w: session is nil", base.ErrInvalidConfig)
	}
	if err := heartbeat.ValidateName("election name", election); err != nil {
		return nil, fmt.Errorf("rethink: %w: %w", base.ErrInvalidConfig, err)
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
	return &Backend{
		session:   session,
		election:  election,
		db:        opts.Database,
		table:     opts.Table,
		noCreate:  opts.NoCreate,
		log:       log.With("election", election),
		closeCtx:  ctx,
		closeFunc: cancel,
	}, nil
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

// Election returns the name of the election, the id of its document.
func (b *Backend) Election() string { return b.election }

// Database returns the database the backend uses.
func (b *Backend) Database() string { return b.db }

// Table returns the table the backend uses.
func (b *Backend) Table() string { return b.table }

func (b *Backend) term() r.Term { return r.DB(b.db).Table(b.table) }

// check returns an error when the backend is closed or ctx is done.
func (b *Backend) check(ctx context.Context) error {
	if b.closed.Load() {
		return fmt.Errorf("rethink: election %q: %w", b.election, base.ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("rethink: election %q: %w", b.election, err)
	}
	return nil
}

// wrap adds context to a driver error. A done ctx wins: the driver reports
// a cancelled query as a timeout of its own. Two answers of a real server
// get a hint: a table without a primary replica (for about a second after a
// restart) is transient, and the Feed retries every call as usual; an
// ambiguous name means duplicate databases or tables, which Create
// resolves.
func (b *Backend) wrap(ctx context.Context, what string, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("rethink: %s: %w", what, cerr)
	}
	if b.closed.Load() {
		return fmt.Errorf("rethink: %s: %w (%v)", what, base.ErrClosed, err)
	}
	switch {
	case unavailable(err):
		return fmt.Errorf("rethink: %s: %w (transient: the table is not ready yet, as after a server restart)", what, err)
	case ambiguous(err):
		return fmt.Errorf("rethink: %s: %w (duplicate databases or tables of one name: Create resolves them)", what, err)
	}
	return fmt.Errorf("rethink: %s: %w", what, err)
}

// run runs q with ctx and returns the first raw response, as the server sent
// it (pseudo-types unconverted).
func (b *Backend) run(ctx context.Context, what string, q r.Term) (json.RawMessage, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	cur, err := q.Run(b.session, r.RunOpts{Context: ctx})
	if err != nil {
		return nil, b.wrap(ctx, what, err)
	}
	defer cur.Close()
	raw, ok := cur.NextResponse()
	if !ok {
		err := cur.Err()
		if err == nil {
			err = errors.New("empty response")
		}
		return nil, b.wrap(ctx, what, err)
	}
	return raw, nil
}

// Start checks that the session reaches a server that answers queries.
func (b *Backend) Start(ctx context.Context) error {
	raw, err := b.run(ctx, "start: checking the server", r.Expr(1))
	if err != nil {
		return err
	}
	if string(raw) != "1" {
		return fmt.Errorf("rethink: start: the server answered r.expr(1) with %s", raw)
	}
	return nil
}

// Get returns the current record of the election.
func (b *Backend) Get(ctx context.Context) (heartbeat.Record, error) {
	raw, err := b.run(ctx, "get "+b.election, b.term().Get(b.election))
	if err != nil {
		return heartbeat.Record{}, err
	}
	if isNull(raw) {
		return heartbeat.Record{}, fmt.Errorf("rethink: election %q in %s.%s: %w", b.election, b.db, b.table, base.ErrNotFound)
	}
	return decodeRecord(b.election, raw)
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

// Heartbeat is the compare-and-set write: an insert with conflict "error"
// when expected.Revision is 0, else one atomic single-document update whose
// function checks that the stored document is a well-formed election
// document holding the write expected names (the same revision, leader and
// term) and raises an error otherwise. The timestamp is the server's
// r.Now(); the lease is stored in whole microseconds, rounded up. A refused
// write is followed by a Get to return a *base.ConflictError with the
// current record, or an error matching base.ErrMalformedRecord when the
// stored document is foreign or malformed (it is never overwritten).
func (b *Backend) Heartbeat(ctx context.Context, expected, next heartbeat.Record) (heartbeat.Record, error) {
	if err := b.check(ctx); err != nil {
		return heartbeat.Record{}, err
	}
	if next.Election != "" && next.Election != b.election {
		return heartbeat.Record{}, fmt.Errorf("rethink: heartbeat: %w: record of election %q given to the backend of %q",
			heartbeat.ErrInvalidRecord, next.Election, b.election)
	}
	next.Election = b.election
	if err := next.Validate(); err != nil {
		return heartbeat.Record{}, fmt.Errorf("rethink: heartbeat: %w", err)
	}
	if next.Term > maxExact || expected.Revision >= maxExact || expected.Term > maxExact {
		return heartbeat.Record{}, fmt.Errorf("rethink: heartbeat: %w: term or revision beyond 2^53", heartbeat.ErrInvalidRecord)
	}
	doc := encodeRecord(b.election, expected.Revision+1, next)
	var q r.Term
	if expected.Revision == 0 {
		q = b.term().Insert(doc, r.InsertOpts{Conflict: "error", ReturnChanges: true, Durability: durability})
	} else {
		delete(doc, fieldID)
		q = b.term().Get(b.election).Update(func(row r.Term) any {
			return r.Branch(casCondition(row, expected), doc, r.Error(conflictMarker))
		}, r.UpdateOpts{ReturnChanges: true, Durability: durability})
	}
	what := fmt.Sprintf("heartbeat of %q on revision %d", b.election, expected.Revision)
	if expected.Revision != 0 {
		what += fmt.Sprintf(" (leader %q, term %d)", expected.Leader, expected.Term)
	}
	raw, err := b.run(ctx, what, q)
	if err != nil {
		return heartbeat.Record{}, err
	}
	var wr writeResult
	if err := json.Unmarshal(raw, &wr); err != nil {
		return heartbeat.Record{}, fmt.Errorf("rethink: %s: cannot decode the write result %.200s: %w", what, raw, err)
	}
	if wr.Errors == 0 && wr.Inserted+wr.Replaced == 1 && len(wr.Changes) == 1 {
		rec, err := decodeRecord(b.election, wr.Changes[0].NewVal)
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
	cur, err := b.Get(ctx)
	switch {
	case errors.Is(err, base.ErrNotFound):
		return heartbeat.Record{}, fmt.Errorf("rethink: %s: %w", what, base.NewConflict(heartbeat.Record{Election: b.election}))
	case errors.Is(err, base.ErrMalformedRecord):
		return heartbeat.Record{}, fmt.Errorf("rethink: %s: refused to overwrite a foreign or malformed document: %w", what, err)
	case err != nil:
		return heartbeat.Record{}, fmt.Errorf("rethink: %s: refused, and reading the current record failed: %w", what, err)
	case ownWrite(cur, expected, next):
		// The driver retried the query after losing the reply of the first
		// try, which had written this very record.
		return cur, nil
	case expected.Revision == 0 || !cur.SameWrite(expected):
		return heartbeat.Record{}, fmt.Errorf("rethink: %s: %w", what, base.NewConflict(cur))
	}
	return heartbeat.Record{}, fmt.Errorf("rethink: %s: the server refused the write (%s) though that write is stored: %v", what, wr.FirstError, cur)
}

// casCondition is true when the stored document row is a well-formed
// election document holding the write expected names: the same revision,
// leader and term (heartbeat.Record.SameWrite), compared by the server
// inside the update function, so the compare-and-set stays one atomic
// operation. It is at least as strict as decodeRecord, so that a
// compare-and-set never overwrites a foreign or malformed document. The one
// check it cannot make exactly is the length of the leader id, counted here
// in characters instead of bytes.
func casCondition(row r.Term, expected heartbeat.Record) r.Term {
	leader := row.Field(fieldLeader).Default(nil)
	term := row.Field(fieldTerm).Default(nil)
	value := row.Field(fieldValue).Default(nil)
	lease := row.Field(fieldLease).Default(nil)
	return r.And(
		row.Field(fieldMark).Default(nil).Eq(formatVersion),
		row.Field(fieldRevision).Default(nil).Eq(expected.Revision),
		row.Field(fieldTimestamp).Default(nil).TypeOf().Eq("PTYPE<TIME>"),
		leader.TypeOf().Eq("STRING"),
		leader.Eq(expected.Leader),
		leader.Match(`^[^\x00-\x1f\x7f]{0,127}$`).Ne(nil),
		term.TypeOf().Eq("NUMBER"),
		term.Eq(expected.Term),
		term.Ge(0), term.Le(maxExact), term.Floor().Eq(term),
		r.Or(value.TypeOf().Eq("NULL"),
			r.And(value.TypeOf().Eq("PTYPE<BINARY>"), value.Count().Le(heartbeat.MaxValueLen), leader.Ne(""))),
		// Missing or null: written before the field existed.
		r.Or(lease.TypeOf().Eq("NULL"),
			r.And(lease.TypeOf().Eq("NUMBER"), lease.Ge(0), lease.Le(maxLeaseMicros), lease.Floor().Eq(lease))),
	)
}

// Close marks the backend closed, ends its open subscriptions and waits for
// their goroutines. It never closes the session. It is idempotent.
func (b *Backend) Close() error {
	if b.closed.Swap(true) {
		return nil
	}
	b.closeFunc()
	b.subs.Wait()
	return nil
}
