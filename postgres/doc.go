// Package postgres is the leaderfeed backend for PostgreSQL, over
// github.com/jackc/pgx/v5.
//
// The caller passes the *pgxpool.Pool it already owns; the backend never
// closes it. Every election is one row of a table (by default
// "public"."leaderfeed"), and every node learns of changes to it through
// LISTEN/NOTIFY.
//
// A Store (NewStore) is the table: any number of elections, keyed by name,
// and the table's changefeed. A process with many elections makes one Store
// and shares it with base.NewElections, which opens one changefeed for all
// of them and renews their records together in batches; a process with one
// election calls New, which is base.Open on a Store of its own:
//
//	store, err := postgres.NewStore(pool, postgres.Options{})
//	els, err := base.NewElections(store, base.ElectionsOptions{})
//	feed, err := els.Feed("tenant-42", nodeID, base.Options{})
//
//	backend, err := postgres.New(pool, "scheduler", postgres.Options{}) // one election
//
// # What is guaranteed
//
//   - Heartbeat is one atomic statement: an UPDATE ... WHERE revision, leader
//     and term are the expected write's, for a renewal or claim, an INSERT ...
//     ON CONFLICT DO NOTHING for the first claim of an election. Of many
//     concurrent claimants on one record exactly one wins; the others get a
//     *backend.ConflictError that carries the record read right after the
//     refused write. The timestamp is the server's clock_timestamp(); the
//     term is stored as given.
//   - HeartbeatBatch (backend.BatchStore) writes many elections' records in one
//     round trip and one transaction: one UPDATE ... FROM unnest(...) for the
//     writes on existing records (the rows are locked in the order of their
//     keys first, so that processes whose batches overlap wait for each other
//     instead of deadlocking) and one INSERT ... SELECT ... FROM unnest(...)
//     ON CONFLICT DO NOTHING for first claims; then, only if some writes were
//     refused, one SELECT ... WHERE election = ANY(...) of their current
//     records. Each write gets exactly what a single Heartbeat would give:
//     the stored record, a *backend.ConflictError, or an error matching
//     backend.ErrMalformedRecord for a malformed stored record, which touches
//     no other write of the batch.
//   - Notifications are sent by AFTER ... FOR EACH STATEMENT triggers on the
//     table (one per INSERT, UPDATE and DELETE, with transition tables), so
//     writes from any client (psql included) reach every listener, in commit
//     order, and one statement that writes many records (a batch) sends them
//     in chunks of records, each notification under the 8,000-byte payload
//     limit, not one notification per row. Create replaces the row-level
//     trigger of older versions (named ChannelPrefix) with them; a process
//     of an older version then no longer understands the election table's
//     notifications, so upgrade every process before the first Create of
//     the new version (or run SchemaSQL), or expect the old ones to learn
//     of changes only by their own reads and refused writes.
//   - Each Subscribe of a Store opens a dedicated LISTEN connection, made from
//     pool.Config().ConnConfig (not a slot of the pool), and closes it when
//     the subscription's context ends or the Store closes; base.Elections
//     subscribes once per Store, so a process holds one LISTEN connection per
//     Store however many elections it runs. The feed carries every election
//     of the table and the watched table's changes, decoded, in commit
//     order; it sends while its reader reads and queues nothing of its own.
//     When the connection drops, the subscription ends with a Failed
//     notification; notifications sent while no subscription listened are
//     lost, which is why base.Feed re-reads the record after it
//     resubscribes.
//   - Malformed rows under the election's key (a leader id with control
//     characters, a negative term, a value longer than heartbeat.MaxValueLen,
//     NULLs) make Get fail with an error matching backend.ErrMalformedRecord and
//     arrive on the feed as Ignored notifications; the feed goes on. Heartbeat
//     never overwrites such a row: it fails with an error matching
//     backend.ErrMalformedRecord.
//   - Names (schema, tables, channel prefix) must match
//     ^[A-Za-z_][A-Za-z0-9_]{0,62}$ and are always quoted; every value
//     travels as a query parameter.
//
// # The 8,000-byte NOTIFY limit
//
// PostgreSQL refuses NOTIFY payloads of 8,000 bytes or more. The triggers
// measure each payload before sending it, and the election table's triggers
// fill each notification with as many records as fit. An election record always fits
// (names are at most 127 bytes and values at most 2,048), so a row that does
// not fit is malformed; it is announced by its key only and the Store's
// feed fetches it with Get, which reports it as malformed. A change to a row of the
// watched table that does not fit is announced with its primary key only and
// arrives as a backend.Change with Partial set and Old and New nil: fetch the
// row by Key. If even the key does not fit, Key is nil as well.
//
// # Watching a table of your own
//
// Options.WatchTable names a table of yours whose inserts, updates and
// deletes arrive as backend.OtherChanged notifications: Old and New are the rows
// as JSON objects (row_to_json), Key is the primary key (the value itself for
// a one-column key, an object of column values for a compound key, null when
// the table has none). TRUNCATE is not reported. Unless Options.NoCreate is
// set, Create installs the trigger on that table; it never creates the table.
//
// # Refusals
//
// Errors are sorted by SQLSTATE. 42501 (insufficient_privilege), class 28
// (authentication), 3D000 (no such database), 42P01, 42703, 3F000 and
// 42883 (a missing or outdated schema) match base.ErrRefused and carry the
// fix: "GRANT USAGE ON SCHEMA ... TO role; GRANT SELECT, INSERT, UPDATE,
// DELETE ON table TO role" for the connection's role, GRANT CREATE ON
// SCHEMA (or SchemaSQL with NoCreate) when Create may not create, CREATE
// DATABASE, or SchemaSQL for a missing table. Every other error (a lost
// connection, a timeout, a standby refusing writes during a failover) is
// transient. Create tells a table that does not exist from one this role
// may not read (has_schema_privilege, has_table_privilege): "election
// table ... exists, but this role has no SELECT privilege on it". It does
// not check write privileges (an observer needs SELECT only): the first
// write that lacks them is refused with "permission denied for table ..."
// and the GRANT.
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
//   - A Feed that falls far behind gets the latest state of the election
//     record rather than every intermediate revision (base.Elections
//     coalesces), and one whose reader falls more than 4,096 changes of the
//     watched table behind fails.
//   - The LISTEN connection must reach the server directly or through a
//     session-mode pooler; a transaction-mode pooler (PgBouncer's default)
//     does not deliver notifications.
//
// The backend needs PostgreSQL 12 or later and was tested on PostgreSQL 15.
package postgres
