package postgres

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// MinServerVersion is the oldest PostgreSQL server Start accepts, as
// server_version_num (12.0).
const MinServerVersion = 120000

// Backend is the base.Backend of one election, kept in a PostgreSQL table.
// Make one with New. Its methods other than Start, Create and Close are safe
// for concurrent use.
type Backend struct {
	pool     *pgxpool.Pool
	election string
	opts     Options
	ddl      ddl

	getSQL, insertSQL, updateSQL string

	closed atomic.Bool

	mu       sync.Mutex // guards listener, subs; held while registering a subscription
	listener *listener
	subs     map[*subscription]struct{}
	wg       sync.WaitGroup // forwarding goroutines of subscriptions
}

var _ base.Backend = (*Backend)(nil)

// New returns a Backend for the election named election, on the database
// that pool reaches. The pool stays the caller's: Close never closes it.
// New does no I/O; it fails with an error matching base.ErrInvalidConfig
// when pool is nil, the election name breaks heartbeat.ValidateName, or a
// name in opts is not a plain identifier.
func New(pool *pgxpool.Pool, election string, opts Options) (*Backend, error) {
	if pool == nil {
		return nil, fmt.Errorf("postgres: pool is nil: %w", base.ErrInvalidConfig)
	}
	if err := heartbeat.ValidateName("election name", election); err != nil {
		return nil, fmt.Errorf("postgres: %w: %w", base.ErrInvalidConfig, err)
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	b := &Backend{pool: pool, election: election, opts: o, ddl: newDDL(o), subs: map[*subscription]struct{}{}}
	const cols = "leader, term, revision, ts, value, lease_us"
	b.getSQL = "SELECT " + cols + " FROM " + b.ddl.table + " WHERE election = $1"
	b.insertSQL = "INSERT INTO " + b.ddl.table + " AS t (election, leader, term, value, lease_us, revision, ts)" +
		" VALUES ($1, $2, $3, $4, $5, 1, clock_timestamp()) ON CONFLICT (election) DO NOTHING RETURNING " + cols
	// The compare-and-set compares the write's identity (revision, leader,
	// term), not the revision alone: see base.Backend.Heartbeat.
	b.updateSQL = "UPDATE " + b.ddl.table + " SET leader = $2, term = $3, value = $4, lease_us = $5, revision = revision + 1," +
		" ts = clock_timestamp() WHERE election = $1 AND revision = $6 AND leader = $7 AND term = $8 RETURNING " + cols
	return b, nil
}

// Election returns the name of the election.
func (b *Backend) Election() string { return b.election }

// Start checks that the server answers and is PostgreSQL 12 or later (an
// error matching base.ErrUnsupported if older).
func (b *Backend) Start(ctx context.Context) error {
	if b.closed.Load() {
		return fmt.Errorf("postgres: Start: %w", base.ErrClosed)
	}
	var version int
	if err := b.pool.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version); err != nil {
		return wrapErr(ctx, "postgres: Start: cannot query the server", err)
	}
	if version < MinServerVersion {
		return fmt.Errorf("postgres: server version %d is older than %d: %w", version, MinServerVersion, base.ErrUnsupported)
	}
	return nil
}

// Create makes the schema, the election table, the trigger functions and
// the triggers (on the election table and on Options.WatchTable) when they
// are missing, or with Options.NoCreate only checks that they exist.
// It is idempotent and safe to run from many processes at once: it runs in
// one transaction under an advisory lock. What it finds missing or of the
// wrong shape fails with an error matching base.ErrInvalidConfig.
func (b *Backend) Create(ctx context.Context) error {
	if b.closed.Load() {
		return fmt.Errorf("postgres: Create: %w", base.ErrClosed)
	}
	var err error
	if !b.opts.NoCreate {
		err = b.create(ctx)
	} else {
		err = b.check(ctx)
	}
	if errors.As(err, new(*missingError)) && !errors.Is(err, base.ErrInvalidConfig) {
		return fmt.Errorf("postgres: %v and Options.NoCreate is set (see SchemaSQL): %w", err, base.ErrInvalidConfig)
	}
	if err != nil {
		return wrapErr(ctx, "postgres: Create", err)
	}
	return nil
}

// Get returns the election's record. It fails with an error matching
// base.ErrNotFound when there is no row, and with one matching
// base.ErrMalformedRecord when the row breaks the record rules.
func (b *Backend) Get(ctx context.Context) (heartbeat.Record, error) {
	if b.closed.Load() {
		return heartbeat.Record{}, fmt.Errorf("postgres: Get: %w", base.ErrClosed)
	}
	return b.get(ctx)
}

func (b *Backend) get(ctx context.Context) (heartbeat.Record, error) {
	r, err := b.scan(b.pool.QueryRow(ctx, b.getSQL, b.election))
	if errors.Is(err, pgx.ErrNoRows) {
		return heartbeat.Record{}, fmt.Errorf("postgres: election %q: %w", b.election, base.ErrNotFound)
	}
	if err != nil {
		return heartbeat.Record{}, wrapErr(ctx, "postgres: Get", err)
	}
	return r, nil
}

// Heartbeat is the compare-and-set write, one atomic statement: an INSERT
// ... ON CONFLICT DO NOTHING when expected.Revision is 0, an UPDATE ... WHERE
// revision, leader and term are expected's otherwise. The timestamp is the server's
// clock_timestamp(). When the statement writes nothing, Heartbeat reads the
// current record and returns it in a *base.ConflictError; if that record is
// malformed it returns an error matching base.ErrMalformedRecord instead, and
// the row is left alone. A next that breaks heartbeat.Record.Validate (or
// names another election) fails with an error matching both
// base.ErrInvalidConfig and heartbeat.ErrInvalidRecord.
func (b *Backend) Heartbeat(ctx context.Context, expected, next heartbeat.Record) (heartbeat.Record, error) {
	expectedRevision := expected.Revision
	if b.closed.Load() {
		return heartbeat.Record{}, fmt.Errorf("postgres: Heartbeat: %w", base.ErrClosed)
	}
	if next.Election == "" {
		next.Election = b.election
	}
	if next.Election != b.election {
		return heartbeat.Record{}, fmt.Errorf("postgres: Heartbeat of election %q given a record of election %q: %w: %w",
			b.election, next.Election, base.ErrInvalidConfig, heartbeat.ErrInvalidRecord)
	}
	if err := next.Validate(); err != nil {
		return heartbeat.Record{}, fmt.Errorf("postgres: Heartbeat: %w: %w", base.ErrInvalidConfig, err)
	}
	if next.Term > math.MaxInt64 || expectedRevision >= math.MaxInt64 || expected.Term > math.MaxInt64 {
		return heartbeat.Record{}, fmt.Errorf("postgres: Heartbeat: term %d or revision %d does not fit a bigint: %w: %w",
			next.Term, expectedRevision, base.ErrInvalidConfig, heartbeat.ErrInvalidRecord)
	}
	value := next.Value
	if value == nil {
		value = []byte{}
	}
	var row pgx.Row
	if expectedRevision == 0 {
		row = b.pool.QueryRow(ctx, b.insertSQL, b.election, next.Leader, int64(next.Term), value, leaseMicros(next.Lease))
	} else {
		row = b.pool.QueryRow(ctx, b.updateSQL, b.election, next.Leader, int64(next.Term), value, leaseMicros(next.Lease),
			int64(expectedRevision), expected.Leader, int64(expected.Term))
	}
	stored, err := b.scan(row)
	if err == nil {
		return stored, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return heartbeat.Record{}, wrapErr(ctx, "postgres: Heartbeat", err)
	}
	cur, err := b.get(ctx)
	switch {
	case err == nil:
		return heartbeat.Record{}, base.NewConflict(cur)
	case errors.Is(err, base.ErrNotFound):
		return heartbeat.Record{}, base.NewConflict(heartbeat.Record{Election: b.election})
	case errors.Is(err, base.ErrMalformedRecord):
		return heartbeat.Record{}, fmt.Errorf("postgres: Heartbeat on revision %d refused, and the stored record is malformed: %w",
			expectedRevision, err)
	}
	return heartbeat.Record{}, fmt.Errorf("postgres: Heartbeat on revision %d refused, and reading the current record failed: %w",
		expectedRevision, err)
}

// Subscribe opens the changefeed of the election on the process's shared
// LISTEN connection (connecting it if it is down) and returns once the
// connection listens, so that every change committed after Subscribe
// returns is delivered. See base.Backend for the semantics of the channel.
func (b *Backend) Subscribe(ctx context.Context) (<-chan base.Notification, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("postgres: Subscribe: %w", err)
	}
	b.mu.Lock()
	if b.closed.Load() {
		b.mu.Unlock()
		return nil, fmt.Errorf("postgres: Subscribe: %w", base.ErrClosed)
	}
	if b.listener == nil {
		b.listener = acquireListener(b.pool, b.opts.Logger)
	}
	s := newSubscription(ctx, b)
	b.subs[s] = struct{}{}
	b.wg.Add(1)
	b.mu.Unlock()

	if err := b.listener.add(s); err != nil {
		s.cancel()
		b.forget(s)
		b.wg.Done()
		if b.closed.Load() {
			return nil, fmt.Errorf("postgres: Subscribe: %w", base.ErrClosed)
		}
		return nil, wrapErr(ctx, "postgres: Subscribe", err)
	}
	go s.run()
	return s.out, nil
}

func (b *Backend) forget(s *subscription) {
	b.mu.Lock()
	delete(b.subs, s)
	b.mu.Unlock()
}

// Close ends every open subscription of the backend, waits for their
// goroutines, and lets go of the shared LISTEN connection (closed when its
// last backend closes). It never closes the pool. It is idempotent; after
// it every method fails with an error matching base.ErrClosed.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed.Swap(true) {
		b.mu.Unlock()
		return nil
	}
	subs := make([]*subscription, 0, len(b.subs))
	for s := range b.subs {
		subs = append(subs, s)
	}
	l := b.listener
	b.mu.Unlock()
	for _, s := range subs {
		s.cancel()
	}
	b.wg.Wait()
	if l != nil {
		l.release()
	}
	return nil
}

// leaseMicros is a lease in whole microseconds, rounded up: a follower
// must never wait less than the writer's lease.
func leaseMicros(d time.Duration) int64 {
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}

// scan reads one row of leader, term, revision, ts, value, lease_us.
func (b *Backend) scan(row pgx.Row) (heartbeat.Record, error) {
	var (
		leader           *string
		term, rev, lease *int64
		ts               *time.Time
		value            []byte
	)
	if err := row.Scan(&leader, &term, &rev, &ts, &value, &lease); err != nil {
		var scanErr pgx.ScanArgError
		if errors.As(err, &scanErr) {
			return heartbeat.Record{}, fmt.Errorf("postgres: election %q: %w: %w", b.election, base.ErrMalformedRecord, err)
		}
		return heartbeat.Record{}, err
	}
	var micros *int64
	if ts != nil {
		m := ts.UnixMicro()
		micros = &m
	}
	return decodeRecord(b.election, leader, term, rev, micros, value, lease)
}

// decodeRecord checks the columns of an election row, from a query or from
// a notification, and makes a Record of them.
//
// leaseMicros nil (a notification of a trigger from before the column
// existed) reads as no lease. A vacant row's lease is ignored: a process of
// an older version writes a vacancy without touching lease_us.
func decodeRecord(election string, leader *string, term, rev, tsMicros *int64, value []byte, leaseMicros *int64) (heartbeat.Record, error) {
	bad := func(format string, args ...any) (heartbeat.Record, error) {
		return heartbeat.Record{}, fmt.Errorf("postgres: election %q: %w: %s", election, base.ErrMalformedRecord, fmt.Sprintf(format, args...))
	}
	switch {
	case leader == nil:
		return bad("leader is NULL")
	case term == nil:
		return bad("term is NULL")
	case rev == nil:
		return bad("revision is NULL")
	case tsMicros == nil:
		return bad("ts is NULL")
	case *term < 0:
		return bad("term %d is negative", *term)
	case *rev <= 0:
		return bad("revision %d is not positive", *rev)
	case leaseMicros != nil && (*leaseMicros < 0 || *leaseMicros > heartbeat.MaxLease.Microseconds()):
		return bad("lease_us %d is out of range [0, %d]", *leaseMicros, heartbeat.MaxLease.Microseconds())
	}
	r := heartbeat.Record{
		Election:  election,
		Leader:    *leader,
		Term:      uint64(*term),
		Revision:  uint64(*rev),
		Timestamp: time.UnixMicro(*tsMicros).UTC(),
	}
	if len(value) > 0 {
		r.Value = value
	}
	if leaseMicros != nil && r.Leader != "" {
		r.Lease = time.Duration(*leaseMicros) * time.Microsecond
	}
	if err := r.Validate(); err != nil {
		return heartbeat.Record{}, fmt.Errorf("postgres: election %q: %w: %w", election, base.ErrMalformedRecord, err)
	}
	return r, nil
}

func decodeBase64(election string, s *string) ([]byte, error) {
	if s == nil { // NULL, read as empty as Get does
		return nil, nil
	}
	v, err := base64.StdEncoding.DecodeString(*s)
	if err != nil {
		return nil, fmt.Errorf("postgres: election %q: %w: value: %w", election, base.ErrMalformedRecord, err)
	}
	return v, nil
}

// wrapErr prefixes err with what and makes sure it matches ctx.Err() when
// ctx is done, whatever pgx made of the cancellation.
func wrapErr(ctx context.Context, what string, err error) error {
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("%s: %w (%v)", what, cerr, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}
