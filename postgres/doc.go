// Package postgres is the leaderfeed backend for PostgreSQL, over
// github.com/jackc/pgx/v5.
//
// The caller passes the *pgxpool.Pool it already owns; the backend never
// closes it. Every election is one row of a table (by default
// "public"."leaderfeed"), and every node learns of changes to it through
// LISTEN/NOTIFY.
//
// # What is guaranteed
//
//   - Heartbeat is one atomic statement: an UPDATE ... WHERE revision = $n
//     for a renewal or claim, an INSERT ... ON CONFLICT DO NOTHING for the
//     first claim of an election. Of many concurrent claimants on one
//     revision exactly one wins; the others get a *base.ConflictError that
//     carries the record read right after the refused write. The timestamp
//     is the server's clock_timestamp(); the term is stored as given.
//   - Notifications are sent by an AFTER ROW trigger on the table, so writes
//     from any client (psql included) reach every listener, in commit order.
//   - Each process holds one dedicated LISTEN connection per *pgxpool.Pool,
//     made from pool.Config().ConnConfig (not a slot of the pool), shared by
//     every Backend and every subscription on that pool. When it drops,
//     every subscription gets a Failed notification; the next Subscribe
//     connects again (with backoff after failed attempts). Notifications sent
//     while it was down are lost, which is why base.Feed re-reads the record
//     after it resubscribes.
//   - Malformed rows under the election's key (a leader id with control
//     characters, a negative term, a value longer than heartbeat.MaxValueLen,
//     NULLs) make Get fail with an error matching base.ErrMalformedRecord and
//     arrive on the feed as Ignored notifications; the feed goes on. Heartbeat
//     never overwrites such a row: it fails with an error matching
//     base.ErrMalformedRecord.
//   - Names (schema, tables, channel prefix) must match
//     ^[A-Za-z_][A-Za-z0-9_]{0,62}$ and are always quoted; every value
//     travels as a query parameter.
//
// # The 8,000-byte NOTIFY limit
//
// PostgreSQL refuses NOTIFY payloads of 8,000 bytes or more. The triggers
// measure each payload before sending it. An election record always fits
// (names are at most 127 bytes and values at most 2,048), so a row that does
// not fit is malformed; it is announced by its key only and the listener
// fetches it with Get, which reports it as malformed. A change to a row of the
// watched table that does not fit is announced with its primary key only and
// arrives as a base.Change with Partial set and Old and New nil: fetch the
// row by Key. If even the key does not fit, Key is nil as well.
//
// # Watching a table of your own
//
// Options.WatchTable names a table of yours whose inserts, updates and
// deletes arrive as base.OtherChanged notifications: Old and New are the rows
// as JSON objects (row_to_json), Key is the primary key (the value itself for
// a one-column key, an object of column values for a compound key, null when
// the table has none). TRUNCATE is not reported. Unless Options.NoCreate is
// set, Create installs the trigger on that table; it never creates the table.
//
// # What is not guaranteed
//
//   - Safety if the server loses commits it acknowledged: with
//     synchronous_commit = off, or after failing over to an asynchronous
//     standby, a crash can hand out one revision twice, and then two nodes
//     can lead at once. Keep synchronous_commit on (the default) for the
//     election table's transactions, and fail over only to synchronous
//     standbys.
//   - The channel is named after Options.ChannelPrefix only, so every
//     listener of that prefix in the database receives the notifications of
//     every table that uses it and drops the ones it does not need. Give each
//     table its own prefix to separate the traffic.
//   - A subscriber that falls far behind gets the latest state of the
//     election record rather than every intermediate revision, and a
//     subscription whose reader falls more than 4,096 changes of the watched
//     table behind fails.
//   - The LISTEN connection must reach the server directly or through a
//     session-mode pooler; a transaction-mode pooler (PgBouncer's default)
//     does not deliver notifications.
//
// The backend needs PostgreSQL 12 or later and was tested on PostgreSQL 15.
package postgres
