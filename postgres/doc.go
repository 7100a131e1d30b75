// Package postgres is the leaderfeed backend for PostgreSQL 12 or later,
// over github.com/jackc/pgx/v5. Every election is one row of a table (by
// default "public"."leaderfeed"), and every node learns of changes to it
// through LISTEN/NOTIFY, sent by statement-level triggers on the table.
// A single write of the Store sends its own notification and sets the
// transaction-local leaderfeed.notified, which the triggers' WHEN skips;
// every other write (a batch, an operator's, an older version's) is
// announced by the triggers.
//
// The caller passes the *pgxpool.Pool it owns; the backend never closes it.
// A Store (NewStore) is the table: any number of elections, and one
// changefeed, which base.Elections shares among them and whose renewals it
// batches. New is base.Open on a Store of its own, for one election:
//
//	store, err := postgres.NewStore(pool, postgres.Options{})
//	els, err := base.NewElections(store, base.ElectionsOptions{})
//	feed, err := els.Feed("tenant-42", nodeID, base.Options{})
//
//	b, err := postgres.New(pool, "scheduler", postgres.Options{}) // one election
//
// Store implements backend.Store, backend.BatchStore (one UPDATE ... FROM
// unnest(...) for many renewals), backend.BatchReader,
// backend.PresenceStore, backend.PresenceBatchStore (one INSERT ... SELECT
// ... FROM unnest(...) for many presence refreshes), backend.GuardStore
// (the compare-and-set's UPDATE also requires the presence row, locked FOR
// SHARE until it commits) and backend.FuncSubscriber (its LISTEN
// connection's goroutine hands each notification on). Every write is one statement that the server
// executes atomically, a compare-and-set on the row's revision, leader and
// term, stamped with the server's clock_timestamp(). Create makes the
// table, its key index (byte order, whatever the database's collation),
// its triggers and their function when missing, in one transaction
// under an advisory lock; with Options.NoCreate it only checks, and
// SchemaSQL returns the script for an administrator. Options.WatchTable
// names a table of yours whose row changes arrive as change events.
//
// What it needs: SELECT, INSERT, UPDATE and DELETE on the election table and
// USAGE on its schema (an observer: SELECT); to create, CREATE on the schema
// and TRIGGER on the tables. Errors that retrying cannot fix (SQLSTATE
// 42501, class 28, 3D000, a missing or outdated schema) match
// base.ErrRefused and carry the fix, a GRANT for the connection's role. Each
// Store holds one dedicated LISTEN connection, made from
// pool.Config().ConnConfig outside the pool; it must reach the server
// directly or through a session-mode pooler (a transaction-mode pooler
// delivers no notifications). Names must match ^[A-Za-z_][A-Za-z0-9_]{0,62}$.
//
// Fencing: a leader that writes into the election's database makes its
// transaction commit only before the next term with Store.Fence (or
// Fence, for a program that made its election with New): in the
// transaction, it locks the election's row FOR SHARE, which every write
// of the record waits for, and checks that the row names a leader in the
// term given; otherwise it fails with base.ErrFenced and the transaction
// cannot commit. Create and SchemaSQL make the SQL function that does the
// same for any language, Table+"_fence" in Schema (FenceFunction); it
// raises SQLSTATE FencedSQLState.
//
// Not guaranteed: safety if the server loses commits it acknowledged
// (synchronous_commit = off, a failover to an asynchronous standby); keep
// synchronous commit on and fail over only to synchronous standbys.
//
// docs/OPERATING.md in the repository has the details: the statements, the
// 8,000-byte NOTIFY limit, watched tables, upgrades, refusals, and what it
// was tested on (PostgreSQL 15).
package postgres
