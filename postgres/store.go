package postgres

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// MinServerVersion is the oldest PostgreSQL server Start accepts, as
// server_version_num (12.0).
const MinServerVersion = 120000

// Store is the backend.Store (and backend.BatchStore, backend.GuardStore)
// of one PostgreSQL election table: any number of elections, one row each,
// and the table's changefeed.
// Make one with NewStore and share it among the elections of a process with
// base.NewElections; New gives the Backend of a lone election. Its methods
// other than Start, Create and Close are safe for concurrent use.
type Store struct {
	pool *pgxpool.Pool
	opts Options
	ddl  ddl

	getSQL, insertSQL, updateSQL             string
	guardedUpdateSQL                         string
	batchUpdateSQL, batchInsertSQL, batchGet string
	presentSQL, presentBatchSQL, absentSQL   string
	participantsSQL, participantsBatchSQL    string

	ctx    context.Context // cancelled by Close: ends the subscriptions
	cancel context.CancelFunc
	closed atomic.Bool

	mu    sync.Mutex // guards feeds; held while checking closed in Subscribe
	feeds map[*feed]uint32
	wg    sync.WaitGroup // one per subscription until its connection is closed
}

var (
	_ backend.BatchStore  = (*Store)(nil)
	_ backend.BatchReader = (*Store)(nil)
	_ backend.GuardStore  = (*Store)(nil)
)

// columns of a record, in the order scanRecord reads them.
const recordCols = "election, leader, term, revision, ts, value, lease_us, successor, handover, incarnation"

// NewStore returns a Store on the election table that opts name, in the
// database that pool reaches. The pool stays the caller's: Close never
// closes it. NewStore does no I/O; it fails with an error matching
// base.ErrInvalidConfig when pool is nil or a name in opts is not a plain
// identifier.
func NewStore(pool *pgxpool.Pool, opts Options) (*Store, error) {
	if pool == nil {
		return nil, fmt.Errorf("postgres: pool is nil: %w", base.ErrInvalidConfig)
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Store{pool: pool, opts: o, ddl: newDDL(o), ctx: ctx, cancel: cancel, feeds: map[*feed]uint32{}}
	t := s.ddl.table
	s.getSQL = "SELECT " + recordCols + " FROM " + t + " WHERE election = $1"
	// A single write announces its row itself (ddl.announce) and the
	// triggers skip it: their function costs a write more than its own
	// notification does, and a handover waits for two writes.
	s.insertSQL = "WITH w AS (INSERT INTO " + t + " AS t (election, leader, term, value, lease_us, successor, handover, incarnation, revision, ts)" +
		" VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 1, clock_timestamp()) ON CONFLICT (election) DO NOTHING RETURNING " + recordCols +
		", " + s.ddl.announce("I") + ") SELECT " + recordCols + " FROM w"
	// The compare-and-set compares the write's identity (revision, leader,
	// term), not the revision alone: see backend.Election.Heartbeat. Every
	// write sets every field, so a renewal clears a handover token and a
	// vacancy the incarnation.
	update := func(cond string) string {
		return "WITH w AS (UPDATE " + t + " AS t SET leader = $2, term = $3, value = $4, lease_us = $5, successor = $9, handover = $10," +
			" incarnation = $11," +
			" revision = t.revision + 1, ts = clock_timestamp() WHERE t.election = $1 AND t.revision = $6 AND t.leader = $7 AND t.term = $8" +
			cond + " RETURNING " + recordCols + ", " + s.ddl.announce("U") + ") SELECT " + recordCols + " FROM w"
	}
	s.updateSQL = update("")
	// The guarded compare-and-set (HeartbeatGuarded): the same, if the
	// presence row $12 of incarnation $13 exists. FOR SHARE locks it until
	// the write commits: an Absent (a DELETE) that came first is waited
	// for and then leaves nothing to lock (no row: nothing written), one
	// that comes later waits for this write's commit.
	s.guardedUpdateSQL = update(" AND EXISTS (SELECT 1 FROM " + t + " AS p WHERE p.election = $12 AND p.incarnation = $13 FOR SHARE)")
	// The batched compare-and-set: the same comparison, one row of unnest
	// per write. The rows are locked first, in the order of their keys, so
	// that two processes updating overlapping sets of elections (two
	// followers claiming the vacancies of a dead leader) queue behind each
	// other instead of deadlocking.
	s.batchUpdateSQL = "WITH v AS MATERIALIZED (SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bytea[]," +
		" $5::bigint[], $6::bigint[], $7::text[], $8::bigint[], $9::text[], $10::bigint[], $11::bigint[])" +
		" AS v(election, leader, term, value, lease_us, exp_rev, exp_leader, exp_term, successor, handover, incarnation))," +
		" l AS MATERIALIZED (SELECT x.election FROM " + t + " AS x WHERE x.election = ANY($1::text[])" +
		" ORDER BY x.election FOR UPDATE)" +
		" UPDATE " + t + " AS t SET leader = v.leader, term = v.term, value = v.value, lease_us = v.lease_us, successor = v.successor," +
		" handover = v.handover, incarnation = v.incarnation, revision = t.revision + 1, ts = clock_timestamp()" +
		" FROM v JOIN l ON l.election = v.election" +
		" WHERE t.election = v.election AND t.revision = v.exp_rev AND t.leader = v.exp_leader AND t.term = v.exp_term" +
		" RETURNING t.election, t.leader, t.term, t.revision, t.ts, t.value, t.lease_us, t.successor, t.handover, t.incarnation"
	s.batchInsertSQL = "INSERT INTO " + t + " AS t (election, leader, term, value, lease_us, successor, handover, incarnation, revision, ts)" +
		" SELECT v.election, v.leader, v.term, v.value, v.lease_us, v.successor, v.handover, v.incarnation, 1, clock_timestamp()" +
		" FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bytea[], $5::bigint[], $6::text[], $7::bigint[], $8::bigint[])" +
		" AS v(election, leader, term, value, lease_us, successor, handover, incarnation)" +
		" ORDER BY v.election ON CONFLICT (election) DO NOTHING RETURNING " + recordCols
	s.batchGet = "SELECT " + recordCols + " FROM " + t + " WHERE election = ANY($1::text[])"
	// A presence write: an upsert of the presence row (see presentUpdate),
	// the subquery reading the clock once for its ts and joined.
	s.presentSQL = "INSERT INTO " + t + " AS t (election, leader, term, revision, ts, value, incarnation, joined)" +
		" SELECT $1::text, $2::text, 0, 0, c.now, $3::bytea, $4::bigint, c.now FROM (SELECT clock_timestamp() AS now) AS c" +
		" ON CONFLICT (election) DO UPDATE" + presentUpdate + " RETURNING set_config('" + notifiedSetting + "', 'on', true)"
	// The presence refreshes of many elections, as Present's upsert
	// (presentSQL): in the order of their keys, so that two processes
	// refreshing overlapping sets of rows queue instead of deadlocking.
	// The subquery reads the clock once per row, for its ts and joined.
	s.presentBatchSQL = "INSERT INTO " + t + " AS t (election, leader, term, revision, ts, value, incarnation, joined)" +
		" SELECT v.election, v.leader, 0, 0, v.now, v.value, v.incarnation, v.now" +
		" FROM (SELECT u.*, clock_timestamp() AS now FROM unnest($1::text[], $2::text[], $3::bytea[], $4::bigint[])" +
		" AS u(election, leader, value, incarnation)) AS v ORDER BY v.election ON CONFLICT (election) DO UPDATE" +
		presentUpdate + " RETURNING set_config('" + notifiedSetting + "', 'on', true)"
	// Absent: the presence row deleted, announced to nobody.
	s.absentSQL = "DELETE FROM " + t + " WHERE election = $1 RETURNING set_config('" + notifiedSetting + "', 'on', true)"
	// The participants of one election, and of many: the presence rows
	// of election e are the keys from e||chr(31) up to e||chr(32) in byte
	// order (no name holds a control character), a range of the key
	// index (keyIndex), with the server's clock on every row, and alone
	// when there is no presence row.
	s.participantsSQL = "SELECT c.now, " + presenceCols + " FROM (SELECT clock_timestamp() AS now) AS c" +
		" LEFT JOIN " + t + " AS t ON " + keyRange("$1::text")
	s.participantsBatchSQL = "SELECT c.now, t.election, " + presenceCols + " FROM (SELECT clock_timestamp() AS now) AS c" +
		" LEFT JOIN (unnest($1::text[]) AS e(name) JOIN " + t + " AS t ON " + keyRange("e.name") + ") ON true"
	return s, nil
}

// New returns the backend.Election of the election named election, for one
// Feed: base.Open on a Store of its own (NewStore), which the Backend's
// Close closes. Processes with many elections share one Store instead
// (base.NewElections). New does no I/O; it fails with an error matching
// base.ErrInvalidConfig when pool is nil, the election name breaks
// heartbeat.ValidateName, or a name in opts is not a plain identifier.
func New(pool *pgxpool.Pool, election string, opts Options) (backend.Election, error) {
	if err := heartbeat.ValidateName("election name", election); err != nil {
		return nil, fmt.Errorf("postgres: %w: %w", base.ErrInvalidConfig, err)
	}
	s, err := NewStore(pool, opts)
	if err != nil {
		return nil, err
	}
	b, err := base.Open(s, election)
	if err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("postgres: %w", err)
	}
	return b, nil
}

// Start checks that the server answers and is PostgreSQL 12 or later (an
// error matching backend.ErrUnsupported if older).
func (s *Store) Start(ctx context.Context) error {
	if s.closed.Load() {
		return fmt.Errorf("postgres: Start: %w", base.ErrClosed)
	}
	var version int
	if err := s.pool.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version); err != nil {
		return s.wrapErr(ctx, "postgres: Start: cannot query the server", err)
	}
	if version < MinServerVersion {
		return fmt.Errorf("postgres: server version %d is older than %d: %w", version, MinServerVersion, backend.ErrUnsupported)
	}
	return nil
}

// Create makes the schema, the election table, the trigger functions and
// the triggers (on the election table and on Options.WatchTable) when they
// are missing, or with Options.NoCreate only checks that they exist.
// It is idempotent and safe to run from many processes at once: it runs in
// one transaction under an advisory lock. What it finds missing or of the
// wrong shape fails with an error matching base.ErrInvalidConfig and
// base.ErrRefused; an election table this role may not read (no SELECT on
// it, or no USAGE on its schema) fails with one matching base.ErrRefused
// that gives the GRANT. Write privileges are not checked here (an
// observer needs none): the first write that lacks one fails with
// base.ErrRefused and the GRANT.
func (s *Store) Create(ctx context.Context) error {
	if s.closed.Load() {
		return fmt.Errorf("postgres: Create: %w", base.ErrClosed)
	}
	var err error
	if !s.opts.NoCreate {
		err = s.create(ctx)
	} else {
		err = s.check(ctx)
	}
	if errors.As(err, new(*missingError)) && !errors.Is(err, base.ErrInvalidConfig) {
		return fmt.Errorf("postgres: %v and NoCreate is set: %w: %w; fix: %s", err, base.ErrRefused, base.ErrInvalidConfig, fixSchema())
	}
	if errors.As(err, new(*hiddenError)) {
		return fmt.Errorf("postgres: %v: %w; fix: %s", err, base.ErrRefused, s.grantFix())
	}
	if err != nil {
		return s.wrapErr(ctx, "postgres: Create", err)
	}
	return nil
}

// Get returns the record of election. It fails with an error matching
// backend.ErrNotFound when there is no row, and with one matching
// backend.ErrMalformedRecord when the row breaks the record rules.
func (s *Store) Get(ctx context.Context, election string) (heartbeat.Record, error) {
	if s.closed.Load() {
		return heartbeat.Record{}, fmt.Errorf("postgres: Get: %w", base.ErrClosed)
	}
	if err := heartbeat.ValidateName("election name", election); err != nil {
		return heartbeat.Record{}, fmt.Errorf("postgres: Get: %w: %w", base.ErrInvalidConfig, err)
	}
	return s.get(ctx, election)
}

// GetBatch reads the records of elections in one statement (SELECT ...
// WHERE election = ANY(...)), each as Get would: an election without a
// row gets ErrNotFound, a malformed row fails only its own election.
func (s *Store) GetBatch(ctx context.Context, elections []string) ([]backend.ReadResult, error) {
	if s.closed.Load() {
		return nil, fmt.Errorf("postgres: GetBatch: %w", base.ErrClosed)
	}
	out := make([]backend.ReadResult, len(elections))
	index := make(heartbeat.Batch, len(elections))
	names := make([]string, 0, len(elections))
	for i, e := range elections {
		if err := index.Add(e, i); err != nil {
			out[i].Err = fmt.Errorf("postgres: GetBatch: %w: %w", base.ErrInvalidConfig, err)
			continue
		}
		names = append(names, e)
	}
	found := make(map[string]bool, len(names))
	if len(names) > 0 {
		rows, err := s.pool.Query(ctx, s.batchGet, names)
		if err != nil {
			return nil, s.wrapErr(ctx, "postgres: GetBatch", err)
		}
		for rows.Next() {
			e, r, err := scanRecordRow(rows)
			if err != nil && !errors.Is(err, backend.ErrMalformedRecord) {
				rows.Close()
				return nil, s.wrapErr(ctx, "postgres: GetBatch", err)
			}
			i, ok := index[e]
			if !ok || found[e] {
				continue
			}
			found[e] = true
			out[i] = backend.ReadResult{Record: r, Err: err}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, s.wrapErr(ctx, "postgres: GetBatch", err)
		}
	}
	for e, i := range index {
		if !found[e] {
			out[i].Err = fmt.Errorf("postgres: election %q: %w", e, backend.ErrNotFound)
		}
	}
	return out, nil
}

func (s *Store) get(ctx context.Context, election string) (heartbeat.Record, error) {
	r, err := scanRecord(s.pool.QueryRow(ctx, s.getSQL, election))
	if errors.Is(err, pgx.ErrNoRows) {
		return heartbeat.Record{}, fmt.Errorf("postgres: election %q: %w", election, backend.ErrNotFound)
	}
	if err != nil {
		return heartbeat.Record{}, s.wrapErr(ctx, "postgres: Get", err)
	}
	return r, nil
}

// checkWrite checks a write before it is sent: next valid (its election
// name included) and every number within a bigint.
func checkWrite(what string, expected, next heartbeat.Record) error {
	if err := heartbeat.ValidateWrite(expected, next, math.MaxInt64); err != nil {
		return fmt.Errorf("postgres: %s: %w: %w", what, base.ErrInvalidConfig, err)
	}
	return nil
}

func valueOf(r heartbeat.Record) []byte {
	if r.Value == nil {
		return []byte{}
	}
	return r.Value
}

// Heartbeat is the compare-and-set write of the record of next.Election,
// one atomic statement: an INSERT ... ON CONFLICT DO NOTHING when
// expected.Revision is 0, an UPDATE ... WHERE revision, leader and term are
// expected's otherwise; the statement sends the notification of the row it
// wrote. The timestamp is the server's clock_timestamp().
// When the statement writes nothing, Heartbeat reads the current record
// and returns it in a *backend.ConflictError; if that record is malformed it
// returns an error matching backend.ErrMalformedRecord instead, and the row is
// left alone. A next that breaks heartbeat.Record.Validate (an invalid
// election name included) fails with an error matching both
// base.ErrInvalidConfig and heartbeat.ErrInvalidRecord.
func (s *Store) Heartbeat(ctx context.Context, expected, next heartbeat.Record) (heartbeat.Record, error) {
	if s.closed.Load() {
		return heartbeat.Record{}, fmt.Errorf("postgres: Heartbeat: %w", base.ErrClosed)
	}
	if err := checkWrite("Heartbeat", expected, next); err != nil {
		return heartbeat.Record{}, err
	}
	var row pgx.Row
	if expected.Revision == 0 {
		row = s.pool.QueryRow(ctx, s.insertSQL, next.Election, next.Leader, int64(next.Term), valueOf(next), heartbeat.LeaseMicros(next.Lease), next.Successor, int64(next.Handover), int64(next.Incarnation))
	} else {
		row = s.pool.QueryRow(ctx, s.updateSQL, next.Election, next.Leader, int64(next.Term), valueOf(next), heartbeat.LeaseMicros(next.Lease),
			int64(expected.Revision), expected.Leader, int64(expected.Term), next.Successor, int64(next.Handover), int64(next.Incarnation))
	}
	return s.written(ctx, "Heartbeat", row, expected, next, nil)
}

// written returns the record the row of a compare-and-set holds, or, when
// the statement wrote none, why, from the current record: a
// *backend.ConflictError carrying it, or (a guarded write, guard set) an
// error matching backend.ErrNotPresent when it is still the expected one.
func (s *Store) written(ctx context.Context, what string, row pgx.Row, expected, next heartbeat.Record, guard *backend.Guard) (heartbeat.Record, error) {
	stored, err := scanRecord(row)
	if err == nil {
		return stored, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return heartbeat.Record{}, s.wrapErr(ctx, "postgres: "+what, err)
	}
	cur, err := s.get(ctx, next.Election)
	switch {
	case err == nil && guard != nil && cur.SameWrite(expected):
		return heartbeat.Record{}, fmt.Errorf("postgres: %s: election %q: node %q of incarnation %d: %w",
			what, next.Election, guard.Node, guard.Incarnation, backend.ErrNotPresent)
	case err == nil:
		return heartbeat.Record{}, backend.NewConflict(cur)
	case errors.Is(err, backend.ErrNotFound):
		return heartbeat.Record{}, backend.NewConflict(heartbeat.Record{Election: next.Election})
	}
	return heartbeat.Record{}, refusedErr(what, expected, err)
}

// HeartbeatGuarded is Heartbeat's UPDATE (expected.Revision is never 0)
// with one more condition in the same statement: the presence row of
// guard.Node in next.Election, of guard.Incarnation, exists, locked FOR
// SHARE until the write commits, so that a concurrent Absent commits
// before it (the write then writes nothing) or waits for it. When the
// statement writes nothing it reads the current record: a missing one or
// another write than expected is a *backend.ConflictError, as for
// Heartbeat (a conflict wins over a missing presence row); expected itself
// means the presence row was missing, an error matching
// backend.ErrNotPresent. An expected.Revision of 0, an invalid guard.Node
// or a guard.Incarnation over heartbeat.MaxToken fails with an error
// matching base.ErrInvalidConfig, and next as for Heartbeat.
func (s *Store) HeartbeatGuarded(ctx context.Context, expected, next heartbeat.Record, guard backend.Guard) (heartbeat.Record, error) {
	if s.closed.Load() {
		return heartbeat.Record{}, fmt.Errorf("postgres: HeartbeatGuarded: %w", base.ErrClosed)
	}
	if expected.Revision == 0 {
		return heartbeat.Record{}, fmt.Errorf("postgres: HeartbeatGuarded: %w: expected revision 0: a guarded write is never a first write", base.ErrInvalidConfig)
	}
	if err := checkWrite("HeartbeatGuarded", expected, next); err != nil {
		return heartbeat.Record{}, err
	}
	if err := heartbeat.ValidateName("guard node", guard.Node); err != nil {
		return heartbeat.Record{}, fmt.Errorf("postgres: HeartbeatGuarded: %w: %w", base.ErrInvalidConfig, err)
	}
	if guard.Incarnation > heartbeat.MaxToken {
		return heartbeat.Record{}, fmt.Errorf("postgres: HeartbeatGuarded: %w: guard incarnation %d is over %d",
			base.ErrInvalidConfig, guard.Incarnation, uint64(heartbeat.MaxToken))
	}
	row := s.pool.QueryRow(ctx, s.guardedUpdateSQL, next.Election, next.Leader, int64(next.Term), valueOf(next),
		heartbeat.LeaseMicros(next.Lease), int64(expected.Revision), expected.Leader, int64(expected.Term), next.Successor,
		int64(next.Handover), int64(next.Incarnation), backend.PresenceKey(next.Election, guard.Node), int64(guard.Incarnation))
	return s.written(ctx, "HeartbeatGuarded", row, expected, next, &guard)
}

// refusedErr is the error of a refused write whose current record could not
// be read (err).
func refusedErr(what string, expected heartbeat.Record, err error) error {
	if errors.Is(err, backend.ErrMalformedRecord) {
		return fmt.Errorf("postgres: %s on revision %d refused, and the stored record is malformed: %w",
			what, expected.Revision, err)
	}
	return fmt.Errorf("postgres: %s on revision %d refused, and reading the current record failed: %w",
		what, expected.Revision, err)
}

// HeartbeatBatch performs writes, each with exactly the semantics of
// Heartbeat, in at most two round trips: one for the writes (one UPDATE
// ... FROM unnest(...) for the writes on an existing record, one INSERT
// ... SELECT ... FROM unnest(...) ON CONFLICT DO NOTHING for the first
// writes of elections, sent together in one transaction), and, if some
// writes were refused, one SELECT of their current records. A write that
// breaks heartbeat.Record.Validate fails alone, and a malformed stored
// record fails only its own write. An error with nil results means the
// outcome of every write is unknown.
func (s *Store) HeartbeatBatch(ctx context.Context, writes []backend.Write) ([]backend.WriteResult, error) {
	if s.closed.Load() {
		return nil, fmt.Errorf("postgres: HeartbeatBatch: %w", base.ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("postgres: HeartbeatBatch: %w", err)
	}
	out := make([]backend.WriteResult, len(writes))
	index := make(heartbeat.Batch, len(writes)) // election -> write, of the writes sent
	var upd struct {
		elections, leaders, expLeaders, successors                []string
		terms, leases, expRevs, expTerms, handovers, incarnations []int64
		values                                                    [][]byte
	}
	var ins struct {
		elections, leaders, successors         []string
		terms, leases, handovers, incarnations []int64
		values                                 [][]byte
	}
	for i, w := range writes {
		if err := checkWrite("HeartbeatBatch", w.Expected, w.Next); err != nil {
			out[i].Err = err
			continue
		}
		e := w.Next.Election
		if err := index.Add(e, i); err != nil {
			out[i].Err = fmt.Errorf("postgres: HeartbeatBatch: %w: %w", base.ErrInvalidConfig, err)
			continue
		}
		if w.Expected.Revision == 0 {
			ins.elections = append(ins.elections, e)
			ins.leaders = append(ins.leaders, w.Next.Leader)
			ins.terms = append(ins.terms, int64(w.Next.Term))
			ins.values = append(ins.values, valueOf(w.Next))
			ins.leases = append(ins.leases, heartbeat.LeaseMicros(w.Next.Lease))
			ins.successors = append(ins.successors, w.Next.Successor)
			ins.handovers = append(ins.handovers, int64(w.Next.Handover))
			ins.incarnations = append(ins.incarnations, int64(w.Next.Incarnation))
			continue
		}
		upd.elections = append(upd.elections, e)
		upd.leaders = append(upd.leaders, w.Next.Leader)
		upd.terms = append(upd.terms, int64(w.Next.Term))
		upd.values = append(upd.values, valueOf(w.Next))
		upd.leases = append(upd.leases, heartbeat.LeaseMicros(w.Next.Lease))
		upd.expRevs = append(upd.expRevs, int64(w.Expected.Revision))
		upd.expLeaders = append(upd.expLeaders, w.Expected.Leader)
		upd.expTerms = append(upd.expTerms, int64(w.Expected.Term))
		upd.successors = append(upd.successors, w.Next.Successor)
		upd.handovers = append(upd.handovers, int64(w.Next.Handover))
		upd.incarnations = append(upd.incarnations, int64(w.Next.Incarnation))
	}
	if len(index) == 0 {
		return out, nil
	}

	var batch pgx.Batch
	if len(upd.elections) > 0 {
		batch.Queue(s.batchUpdateSQL, upd.elections, upd.leaders, upd.terms, upd.values, upd.leases,
			upd.expRevs, upd.expLeaders, upd.expTerms, upd.successors, upd.handovers, upd.incarnations)
	}
	if len(ins.elections) > 0 {
		batch.Queue(s.batchInsertSQL, ins.elections, ins.leaders, ins.terms, ins.values, ins.leases, ins.successors, ins.handovers, ins.incarnations)
	}
	written := make(map[string]bool, len(index))
	br := s.pool.SendBatch(ctx, &batch)
	err := func() error {
		for range batch.Len() {
			rows, err := br.Query()
			if err != nil {
				return err
			}
			for rows.Next() {
				e, r, err := scanRecordRow(rows)
				if err != nil && !errors.Is(err, backend.ErrMalformedRecord) {
					rows.Close()
					return err
				}
				i, ok := index[e]
				if !ok {
					rows.Close()
					return fmt.Errorf("the server returned a row of election %q, which the batch did not write", e)
				}
				written[e] = true
				out[i] = backend.WriteResult{Record: r, Err: err}
			}
			if err := rows.Err(); err != nil {
				return err
			}
		}
		return nil
	}()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, s.wrapErr(ctx, "postgres: HeartbeatBatch", err)
	}

	// The refused writes get the current record of their election.
	var refused []string
	for e := range index {
		if !written[e] {
			refused = append(refused, e)
		}
	}
	if len(refused) == 0 {
		return out, nil
	}
	found := make(map[string]bool, len(refused))
	rows, err := s.pool.Query(ctx, s.batchGet, refused)
	if err == nil {
		for rows.Next() {
			e, cur, rerr := scanRecordRow(rows)
			i, ok := index[e]
			if !ok || written[e] {
				continue
			}
			if rerr != nil && !errors.Is(rerr, backend.ErrMalformedRecord) {
				err = rerr
				break
			}
			found[e] = true
			if rerr != nil {
				out[i].Err = refusedErr("HeartbeatBatch", writes[i].Expected, rerr)
			} else {
				out[i].Err = backend.NewConflict(cur)
			}
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	for _, e := range refused {
		if found[e] {
			continue
		}
		i := index[e]
		if err != nil {
			// Written or not: the statement that wrote nothing ran, so
			// these writes were refused; only their current record is
			// unknown, as for a single Heartbeat whose read failed.
			out[i].Err = refusedErr("HeartbeatBatch", writes[i].Expected, s.wrapErr(ctx, "postgres: HeartbeatBatch", err))
		} else {
			out[i].Err = backend.NewConflict(heartbeat.Record{Election: e})
		}
	}
	return out, nil
}

// Close ends every open subscription of the store (each ends with a Failed
// notification matching base.ErrClosed, sent while its reader's context
// lasts) and waits until their LISTEN connections are closed. It never
// closes the pool. It is idempotent; after it every method fails with an
// error matching base.ErrClosed.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed.Swap(true) {
		s.mu.Unlock()
		return nil
	}
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	return nil
}

// scanRecord reads one row of recordCols.
func scanRecord(row pgx.Row) (heartbeat.Record, error) {
	_, r, err := scanRecordRow(row)
	return r, err
}

// scanRecordRow reads one row of recordCols and returns its election as
// well as the record, so that a malformed row still names its election.
func scanRecordRow(row pgx.Row) (string, heartbeat.Record, error) {
	var (
		election                                string
		leader, successor                       *string
		term, rev, lease, handover, incarnation *int64
		ts                                      *time.Time
		value                                   []byte
	)
	if err := row.Scan(&election, &leader, &term, &rev, &ts, &value, &lease, &successor, &handover, &incarnation); err != nil {
		var scanErr pgx.ScanArgError
		if errors.As(err, &scanErr) && election != "" {
			return election, heartbeat.Record{}, fmt.Errorf("postgres: election %q: %w: %w", election, backend.ErrMalformedRecord, err)
		}
		return election, heartbeat.Record{}, err
	}
	var micros *int64
	if ts != nil {
		m := ts.UnixMicro()
		micros = &m
	}
	r, err := decodeRecord(election, leader, term, rev, micros, value, lease, successor, handover, incarnation)
	return election, r, err
}

// decodeRecord checks the columns of an election row, from a query or from
// a notification, and makes a Record of them (heartbeat.Decode). A nil
// leaseMicros, successor, handover or incarnation (a notification of a
// trigger from before the column existed) reads as none.
func decodeRecord(election string, leader *string, term, rev, tsMicros *int64, value []byte, leaseMicros *int64, successor *string, handover, incarnation *int64) (heartbeat.Record, error) {
	null := func(column string) (heartbeat.Record, error) {
		return heartbeat.Record{}, fmt.Errorf("postgres: election %q: %w: %s is NULL", election, backend.ErrMalformedRecord, column)
	}
	switch {
	case leader == nil:
		return null("leader")
	case term == nil:
		return null("term")
	case rev == nil:
		return null("revision")
	case tsMicros == nil:
		return null("ts")
	}
	r, err := heartbeat.Decode(heartbeat.Stored{Election: election, Leader: *leader, Term: *term, Revision: *rev,
		Timestamp: time.UnixMicro(*tsMicros).UTC(), Value: value, LeaseMicros: leaseMicros, Successor: successor, Handover: handover, Incarnation: incarnation})
	if err != nil {
		return heartbeat.Record{}, fmt.Errorf("postgres: election %q: %w: %w", election, backend.ErrMalformedRecord, err)
	}
	return r, nil
}

func decodeBase64(election string, s *string) ([]byte, error) {
	if s == nil { // NULL, read as empty as Get does
		return nil, nil
	}
	v, err := base64.StdEncoding.DecodeString(*s)
	if err != nil {
		return nil, fmt.Errorf("postgres: election %q: %w: value: %w", election, backend.ErrMalformedRecord, err)
	}
	return v, nil
}

// wrapErr prefixes err with what and makes sure it matches ctx.Err() when
// ctx is done, whatever pgx made of the cancellation. It sorts the
// server's refusals (see refusal) from transient failures.
func (s *Store) wrapErr(ctx context.Context, what string, err error) error {
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("%s: %w (%v)", what, cerr, err)
	}
	if rerr := s.refusal(what, err); rerr != nil {
		return rerr
	}
	return fmt.Errorf("%s: %w", what, err)
}

// refusal returns err wrapped with base.ErrRefused, the cause and the fix
// when it is a refusal that retrying cannot fix, judged by its SQLSTATE;
// nil when it is not (a lost connection, a timeout, a serialization
// failure, a standby refusing writes during a failover: transient).
func (s *Store) refusal(what string, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return nil
	}
	switch code := pgErr.Code; {
	case code == "42501": // insufficient_privilege
		if strings.HasPrefix(what, "postgres: Create") && !s.opts.NoCreate {
			return fmt.Errorf("%s: %w: %w; fix: %s and set NoCreate, or GRANT CREATE ON SCHEMA %s TO %s",
				what, base.ErrRefused, err, fixApply, s.ddl.schema, s.role())
		}
		return fmt.Errorf("%s: %w: %w; fix: %s", what, base.ErrRefused, err, s.grantFix())
	case strings.HasPrefix(code, "28"): // invalid_authorization_specification, invalid_password
		return fmt.Errorf("%s: %w: %w; fix: the user and password of the connection (and the server's pg_hba.conf)", what, base.ErrRefused, err)
	case code == "3D000": // invalid_catalog_name: no such database
		return fmt.Errorf("%s: %w: %w; fix: CREATE DATABASE, or name an existing database in the connection string", what, base.ErrRefused, err)
	case code == "42P01" || code == "42703" || code == "3F000" || code == "42883":
		// undefined_table, undefined_column, invalid_schema_name,
		// undefined_function: the schema was never made (or is of an
		// older version) on this database.
		return fmt.Errorf("%s: %w: %w: the election table is missing or of another shape (%w); fix: %s",
			what, base.ErrRefused, base.ErrInvalidConfig, err, fixSchema())
	}
	return nil
}

// fixApply and fixSchema say how to make a missing or outdated schema.
const fixApply = "apply SchemaSQL (the output of `leaderfeed schema`) as a role that may create tables"

func fixSchema() string { return fixApply + ", or let Create make it (NoCreate unset)" }

// role returns the role the pool connects as, quoted.
func (s *Store) role() string { return pgx.Identifier{s.pool.Config().ConnConfig.User}.Sanitize() }

// grantFix returns the statements that give the role what the Store
// needs on the election table.
func (s *Store) grantFix() string {
	return "GRANT USAGE ON SCHEMA " + s.ddl.schema + " TO " + s.role() +
		"; GRANT SELECT, INSERT, UPDATE, DELETE ON " + s.ddl.table + " TO " + s.role()
}
