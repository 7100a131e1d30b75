// Package rethink is a leaderfeed backend for RethinkDB, over the driver
// gopkg.in/rethinkdb/rethinkdb-go.v6.
//
// A Store (NewStore) is one table: the records of any number of elections,
// each one document keyed by the election's name in the primary key "id",
// and one changefeed on the table for all of them. It implements
// backend.Store and backend.BatchStore; a process with many elections shares one
// Store through base.NewElections, which demultiplexes the feed to the
// elections and batches their renewals. New(session, election, opts) is
// the Backend of a lone election (base.Open on a Store of its own). The
// caller passes the *r.Session it owns; no Store ever closes it. The same
// table may hold documents of the caller's own, whose changes the feed
// reports as backend.OtherChanged, as in the original JavaScript leaderfeed.
// An election document looks like
//
//	{"id": "jobs", "leaderfeed": 1, "leader": "node-a", "term": 7,
//	 "revision": 42, "timestamp": r.now(), "value": r.binary(...) or null,
//	 "lease_us": 1500000}
//
// "lease_us" is the writer's lease (heartbeat.Record.Lease) in whole
// microseconds, rounded up; 0 when vacant. A document written before the
// field existed lacks it and is a record with Lease 0; a lease on a vacant
// document (left by such an older writer's update, which merges) is
// ignored.
//
// The field "leaderfeed" marks it as ours (format version 1). A document
// with the election's id that lacks the mark, misses a field or holds a
// field of the wrong type is foreign or malformed: Get reports it with an
// error matching backend.ErrMalformedRecord, and Heartbeat never overwrites
// it. The feed tells election documents from the application's by the
// mark: a change in which the old or the new document has the field
// "leaderfeed" (any value) and a string id is a change of that election's
// record (RecordChanged, or Ignored with Notification.Election set when
// the new document is malformed or lost its mark, or RecordDeleted); any
// other change is the application's (OtherChanged). A foreign document
// without the mark that is written where no election document was is
// therefore reported as the application's; Get and Heartbeat still refuse
// it as malformed.
//
// # Guarantees
//
//   - Every write is one single-document operation that RethinkDB executes
//     atomically: the first claim is an insert with conflict "error" (a
//     duplicate primary key means someone else was first), every later
//     write is Get(id).Update(func(row) r.Branch(revision, leader and term
//     match and the document is well formed, new record, r.Error(...))):
//     the write's identity, not the revision alone, so that a revision
//     handed out twice after a lost write is told apart. The timestamp is
//     r.Now(), the server's clock.
//   - HeartbeatBatch writes many elections' records with at most three
//     queries: one getAll(ids...).update(func) for the writes on existing
//     records, whose function looks each document's expected write up in
//     a literal object keyed by id and applies the same condition as
//     Heartbeat (atomic per document); one insert([...], conflict
//     "error") for the first claims; and one getAll of the refused ones'
//     current documents. Each result is what Heartbeat gives for that
//     write alone (the stored record, a *backend.ConflictError with the
//     current record, or ErrMalformedRecord); the batch is not a
//     transaction, and a malformed record or a conflict of one election
//     never affects the others.
//   - The feed is one changefeed on the whole table for every election,
//     read in the order the server sends it (commit order per document)
//     and sent on as it comes, without a queue and without coalescing
//     (base.Elections does both). RethinkDB sends whole documents, so no
//     record is too large for a notification. A feed that breaks, or in
//     which the server reports skipped changes, ends with one backend.Failed
//     notification; the caller reopens it and re-reads.
//   - Every method honours its context; an error caused by a done context
//     matches ctx.Err() under errors.Is.
//   - The driver retries a query on a broken connection. If a compare-and-
//     set was applied but its reply was lost, the retry finds the new
//     revision; Heartbeat recognises its own write (same leader, term,
//     value, lease and revision expected+1, which only this write can produce when
//     node ids are unique) and returns it as success rather than a
//     conflict.
//
// # Creating, duplicates and durability
//
// Create creates the database and the table when they are missing, unless
// Options.NoCreate is set. On a real RethinkDB (2.4.4, measured) concurrent
// dbCreate or tableCreate calls with one name can all succeed and leave
// duplicates, after which every query naming them fails as ambiguous.
// Create therefore lists the databases and tables of the configured names
// in the system tables rethinkdb.db_config and rethinkdb.table_config, keeps
// the same one in every process (the lowest id; for databases, the one
// holding the most tables) and drops the others by id, logging each drop at
// Warn on Options.Logger. It never drops a duplicate database that holds
// tables other than the election table: it fails with an error matching
// base.ErrInvalidConfig instead. A deployment left with duplicates heals on
// the next Create. Store.Create explains why what a dropped duplicate
// held does not matter for safety. Reading the system tables needs the
// admin user; without it Create warns and works by name only.
//
// When several processes start together on a fresh server, each one's
// Create creates the database, lists the databases of the name and drops
// all but the one every process keeps, does the same for the table, and
// waits for the table by name. A slower process's create call can still
// add a duplicate after a listing; the next step that names the database
// or the table (the wait, a tableCreate) then gets the server's answer
// "ambiguous", which Create takes for what it is, duplicates, and lists
// and converges again. Create returns once two listings, each followed by
// a successful wait, show the same table, and never returns "ambiguous".
// Every process then ends with the one database and table, except that a
// create call still in flight when a process returns may add a table with
// a lower id, kept in place of the one that process returned (Store.Create
// says why that is safe). Without the admin user Create cannot see
// duplicates: it retries by name for up to 30 seconds, in case another
// process's Create resolves them, then fails saying so.
//
// Every write of an election document asks for durability "hard", which
// overrides a table configured with durability "soft"; Create warns about
// such a table (the application's own documents in it are not safe) and
// about write_acks "single". For about a second after a restart a real
// server answers that a table's primary replica is not available: Create
// waits that out, and for the other calls it is an ordinary transient
// error that the Feed retries.
//
// # Refusals
//
// Credentials the server rejects (r.RQLAuthError), a user without the
// permission ("User `u` does not have the required `write` permission";
// the fix is r.db(DB).table(T).grant(USER, {read: true, write: true}) as
// admin), a database or table that does not exist, and a table with
// another primary key match base.ErrRefused and carry the fix. Every other
// error is transient, a table without its primary replica included.
//
// # Limits
//
// Database and table names must match ^[A-Za-z0-9_-]+$ and be at most
// MaxTableNameLen bytes; the database "rethinkdb" (the system database) is
// refused. Election names and node ids follow package heartbeat (at most 127
// bytes, which is also RethinkDB's primary key limit). Term and Revision are
// stored as JSON numbers, exact up to 2^53. A table that the store did
// not create must have the primary key "id".
//
// # Driver issues
//
// rethinkdb-go v6.2.1, the latest release, has a data race in its
// connection pool: Pool.conn reads a connection slot without the pool's
// lock while a concurrent query that found the connection broken replaces
// it under the lock. It shows up under the race detector only when queries
// on one session overlap the reconnect after a broken connection; the
// driver then retries the query on the new connection. This backend's own
// queries overlap (the feed opens while the leader renews), so tests that
// break a session's connection and run with -race must make that node's
// calls one at a time, as this package's tests do.
//
// # Tested on
//
// A real RethinkDB 2.4.4, outside CI: the conformance suite passes without
// serialized writes (the update-function compare-and-set is atomic), and
// five node processes went through 120 injected faults, server restarts
// included, with no overlap of leaders. That run found the duplicate
// tables of concurrent creators. The resolution described above then
// passed TestCreateConcurrent (eight creators) 19 times in 20 there; the
// failure was a step naming the table after converging, answered
// "ambiguous", which Create now takes as duplicates. That change has run
// only against the fake catalog so far. The decisions are pure functions,
// tested on every run together with the convergence loop against a fake
// catalog that races like the real server.
//
// The Store (one changefeed for all elections, HeartbeatBatch) has run on
// reqlite only so far; its queries use nothing a RethinkDB 2.4 lacks
// (getAll, update with a function, r.expr of an object, getField, branch,
// error, insert of an array with conflict "error", returnChanges).
//
// In CI the tests run against reqlite, a RethinkDB 2.0-protocol server in
// JavaScript (or a real server named by LEADERFEED_RETHINK_ADDR). reqlite
// does not execute update functions atomically across connections, so the
// reqlite-backed tests serialize the stores' writes: a passing run on
// reqlite is no proof of atomicity, only of the protocol and the logic
// around it. reqlite also shares one query's r.now() value, as one
// JavaScript object, among all the documents the query writes, and a later
// update merges a new time into that object in place: after a batch, a
// write of one election moves the stored timestamp of the other elections
// of that batch, which a real RethinkDB never does (it stores values). The
// tests that read records after batches compare them without the
// timestamp on reqlite. It runs one query at a time, so it never makes duplicates;
// its system tables are empty and it lacks table.wait(), status() and
// config(), so there Create works by name and cannot check durability.
package rethink
