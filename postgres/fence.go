package postgres

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// FencedSQLState is the SQLSTATE the fence function (FenceFunction) raises
// when the election's record does not name a leader in the term asked:
// class "LF" is leaderfeed's own, unused by PostgreSQL.
const FencedSQLState = "LF001"

// fenceSuffix ends the name of the fence function: Table+fenceSuffix.
const fenceSuffix = "_fence"

// fenceFuncName returns the name of the fence function of the election
// table named table: table+"_fence", which is unique in the schema because
// table names are (a function named after ChannelPrefix would be shared
// by every table that shares the prefix). When that is longer than an
// identifier may be (63 bytes), the table name is cut to 48 bytes and a
// hash of the whole name is added, so that two long names with a common
// start still get functions of their own.
func fenceFuncName(table string) string {
	if len(table)+len(fenceSuffix) <= 63 {
		return table + fenceSuffix
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(table))
	return fmt.Sprintf("%s_%08x%s", table[:48], h.Sum32(), fenceSuffix)
}

// FenceFunction returns the quoted, schema-qualified name of the SQL
// function that Create and SchemaSQL make for the election table of opts,
// `"public"."leaderfeed_fence"` by default: Table+"_fence" in Schema. It
// takes (election text, term bigint) and returns nothing; see Fence for
// what it does and docs/OPERATING.md for its use from psql or any
// language. It fails with an error matching base.ErrInvalidConfig for the
// names NewStore rejects.
func FenceFunction(opts Options) (string, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return "", err
	}
	return fenceFunc(o), nil
}

func fenceFunc(o Options) string { return pgx.Identifier{o.Schema, fenceFuncName(o.Table)}.Sanitize() }

// fenceFunctionBody is the body of the fence function of the election
// table table (quoted). It locks the election's row FOR SHARE, which
// every write of the record (an UPDATE or DELETE of the row) waits for
// until the transaction ends, and checks that the row names a leader in
// term $2; if not, it raises FencedSQLState, with the election, the term
// asked and the term found in the message and as JSON in the DETAIL.
// Under REPEATABLE READ and SERIALIZABLE, a row written after the
// transaction's snapshot makes the lock fail with 40001 (a serialization
// failure) instead. When the fence holds, it bounds the time the
// transaction may stay idle (idle_in_transaction_session_timeout, for the
// rest of the transaction) to the leader's lease: a client paused while
// its transaction holds the lock would otherwise keep the next leader's
// claim waiting for as long as the pause lasts.
func fenceFunctionBody(table string) string {
	return `
DECLARE
  found_leader text;
  found_term bigint;
  found_lease bigint;
BEGIN
  SELECT r.leader, r.term, r.lease_us INTO found_leader, found_term, found_lease
    FROM ` + table + ` AS r WHERE r.election = $1 FOR SHARE;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = '` + FencedSQLState + `',
      MESSAGE = format('leaderfeed: election %s is fenced: term %s asked, no record found', to_json($1), $2),
      DETAIL = json_build_object('election', $1, 'asked', $2, 'found', NULL)::text;
  END IF;
  IF found_leader = '' THEN
    RAISE EXCEPTION USING ERRCODE = '` + FencedSQLState + `',
      MESSAGE = format('leaderfeed: election %s is fenced: term %s asked, term %s found with no leader', to_json($1), $2, found_term),
      DETAIL = json_build_object('election', $1, 'asked', $2, 'found', found_term, 'leader', found_leader)::text;
  END IF;
  IF found_term IS DISTINCT FROM $2 THEN
    RAISE EXCEPTION USING ERRCODE = '` + FencedSQLState + `',
      MESSAGE = format('leaderfeed: election %s is fenced: term %s asked, term %s found (leader %s)', to_json($1), $2, found_term, to_json(found_leader)),
      DETAIL = json_build_object('election', $1, 'asked', $2, 'found', found_term, 'leader', found_leader)::text;
  END IF;
  IF found_lease > 0 THEN
    PERFORM set_config('idle_in_transaction_session_timeout', ((found_lease + 999) / 1000)::text, true);
  END IF;
END
`
}

// createFenceFunction returns the statement that makes (or replaces) the
// fence function of the election table of o.
func createFenceFunction(o Options) string {
	return "CREATE OR REPLACE FUNCTION " + fenceFunc(o) + "(election text, term bigint) RETURNS void LANGUAGE plpgsql AS $leaderfeed$" +
		fenceFunctionBody(newDDL(o).table) + "$leaderfeed$"
}

// ensureFenceFunction makes the fence function when it is missing or has
// another body (Create, in its transaction). It looks first, so that a
// role that does not own the function can run Create once it is right.
func ensureFenceFunction(ctx context.Context, tx pgx.Tx, o Options) error {
	var src string
	err := tx.QueryRow(ctx, `SELECT p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = $1 AND p.proname = $2 AND p.pronargs = 2`, o.Schema, fenceFuncName(o.Table)).Scan(&src)
	switch {
	case err == nil && src == fenceFunctionBody(newDDL(o).table):
		return nil
	case err != nil && !errors.Is(err, pgx.ErrNoRows):
		return err
	}
	_, err = tx.Exec(ctx, createFenceFunction(o))
	return err
}

// Fence makes tx's commit come before any later claim, handover or
// vacancy of election, or fails: it locks the election's row in tx (FOR
// SHARE, until tx ends; every write of the record waits for it) and
// checks that the row names a leader in term. Call it in the leader's
// transaction before (or after) its writes and commit only when it
// returned nil: a write guarded so never commits after the next term
// began. When the record names another term, no leader, or is missing,
// Fence fails with an error matching base.ErrFenced that names the
// election, the term asked and the term found, and tx is aborted: its
// commit rolls back. Under REPEATABLE READ and SERIALIZABLE, a record
// written after tx's snapshot was taken (another node's claim, or a
// renewal by this leader in the same term) cannot be locked in that
// snapshot: Fence fails with an error matching base.ErrFenced that
// wraps the server's serialization failure (a *pgconn.PgError with Code
// "40001"); retry in a new transaction while still leading, which fences
// again against the present record.
//
// The lock holds off the leader's own renewals too, so keep fenced
// transactions short (well under HeartbeatInterval) and bounded by the
// leader context: a renewal that waits past the lease costs the
// leadership. For the rest of tx, Fence also sets
// idle_in_transaction_session_timeout to the leader's lease, so that a
// client paused while its transaction holds the lock holds up the next
// leader's claim for at most about a lease; set it again after Fence to
// choose another bound. Fence several elections in one transaction in the
// order of their names, the order a batch of renewals locks them in.
//
// It calls the fence function (FenceFunction), which Create makes; a
// table made by an earlier version without it (Options.NoCreate) fails
// with an error matching base.ErrRefused until SchemaSQL is applied. The
// role needs SELECT and UPDATE on the election table (FOR SHARE needs
// UPDATE). It fails with an error matching base.ErrInvalidConfig when
// tx is nil, election breaks heartbeat.ValidateName, or term is 0 or
// above math.MaxInt64.
func (s *Store) Fence(ctx context.Context, tx pgx.Tx, election string, term uint64) error {
	if s.closed.Load() {
		return fmt.Errorf("postgres: Fence: %w", base.ErrClosed)
	}
	return fence(ctx, tx, s.opts, election, term)
}

// Fence is Store.Fence for a program that holds no Store (its election
// made with New): opts are the Options given to New, which name the
// election table.
func Fence(ctx context.Context, tx pgx.Tx, opts Options, election string, term uint64) error {
	o, err := opts.withDefaults()
	if err != nil {
		return err
	}
	return fence(ctx, tx, o, election, term)
}

func fence(ctx context.Context, tx pgx.Tx, o Options, election string, term uint64) error {
	if err := heartbeat.ValidateName("election name", election); err != nil {
		return fmt.Errorf("postgres: Fence: %w: %w", base.ErrInvalidConfig, err)
	}
	switch {
	case term == 0 || term > math.MaxInt64:
		return fmt.Errorf("postgres: Fence: election %q: term %d is no leader's term: %w", election, term, base.ErrInvalidConfig)
	case tx == nil:
		return fmt.Errorf("postgres: Fence: tx is nil: %w", base.ErrInvalidConfig)
	}
	_, err := tx.Exec(ctx, "SELECT "+fenceFunc(o)+"($1, $2)", election, int64(term))
	if err == nil {
		return nil
	}
	return fenceErr(ctx, tx, o, election, term, err)
}

// fenceErr sorts an error of the fence function: fenced (FencedSQLState,
// or a serialization failure), refused (missing function or privilege),
// or transient.
func fenceErr(ctx context.Context, tx pgx.Tx, o Options, election string, term uint64, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
			return fmt.Errorf("postgres: Fence: election %q: %w (%v)", election, cerr, err)
		}
		return fmt.Errorf("postgres: Fence: election %q: %w", election, err)
	}
	d := newDDL(o)
	switch pgErr.Code {
	case FencedSQLState:
		return fmt.Errorf("postgres: Fence: %w: %w", base.ErrFenced, err)
	case "40001": // serialization_failure
		return fmt.Errorf("postgres: Fence: election %q: term %d asked, term found unknown: the record was written after "+
			"this transaction's snapshot (a new term, or a renewal of this one: retry in a new transaction): %w: %w",
			election, term, base.ErrFenced, err)
	case "42883", "42P01", "3F000": // undefined_function, undefined_table, invalid_schema_name
		return fmt.Errorf("postgres: Fence: election %q: %w: %w: the fence function %s or the election table %s is missing "+
			"(a table made by a version before Fence, or another Options): %w; fix: %s",
			election, base.ErrRefused, base.ErrInvalidConfig, fenceFunc(o), d.table, err, fixSchema())
	case "42501": // insufficient_privilege
		role := pgx.Identifier{tx.Conn().Config().User}.Sanitize()
		return fmt.Errorf("postgres: Fence: election %q: %w: %w; fix: GRANT USAGE ON SCHEMA %s TO %s; GRANT SELECT, UPDATE ON %s TO %s",
			election, base.ErrRefused, err, d.schema, role, d.table, role)
	}
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("postgres: Fence: election %q: %w (%v)", election, cerr, err)
	}
	return fmt.Errorf("postgres: Fence: election %q: %w", election, err)
}
