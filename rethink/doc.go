// Package rethink is a leaderfeed backend for RethinkDB, over the driver
// gopkg.in/rethinkdb/rethinkdb-go.v6.
//
// The caller passes the *r.Session it owns; the backend never closes it. The
// election record is one document of a table, keyed by the election's name
// in the primary key "id"; the same table may hold documents of the
// caller's own, whose changes the feed reports as base.OtherChanged, as in
// the original JavaScript leaderfeed. Several elections may share a table;
// the documents of the other elections are not reported as changes. An
// election document looks like
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
// error matching base.ErrMalformedRecord, the feed sends base.Ignored and
// goes on, and Heartbeat never overwrites it.
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
//   - The feed is a changefeed on the whole table, read in the order the
//     server sends it (commit order per document). A feed that breaks, or
//     in which the server reports skipped changes, ends with one
//     base.Failed notification; the caller reopens it and re-reads.
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
// the next Create. Backend.Create explains why what a dropped duplicate
// held does not matter for safety. Reading the system tables needs the
// admin user; without it Create warns and works by name only.
//
// Every write of an election document asks for durability "hard", which
// overrides a table configured with durability "soft"; Create warns about
// such a table (the application's own documents in it are not safe) and
// about write_acks "single". For about a second after a restart a real
// server answers that a table's primary replica is not available: Create
// waits that out, and for the other calls it is an ordinary transient
// error that the Feed retries.
//
// # Limits
//
// Database and table names must match ^[A-Za-z0-9_-]+$ and be at most
// MaxTableNameLen bytes; the database "rethinkdb" (the system database) is
// refused. Election names and node ids follow package heartbeat (at most 127
// bytes, which is also RethinkDB's primary key limit). Term and Revision are
// stored as JSON numbers, exact up to 2^53. A table that the backend did
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
// tables of concurrent creators; the resolution described above is
// written from RethinkDB's documentation of its system tables and has not
// yet run against a real server. Its decisions are pure functions, tested
// on every run together with the convergence loop against a fake catalog
// that races like the real server.
//
// In CI the tests run against reqlite, a RethinkDB 2.0-protocol server in
// JavaScript (or a real server named by LEADERFEED_RETHINK_ADDR). reqlite
// does not execute update functions atomically across connections, so the
// reqlite-backed tests serialize the backend's writes: a passing run on
// reqlite is no proof of atomicity, only of the protocol and the logic
// around it. It runs one query at a time, so it never makes duplicates;
// its system tables are empty and it lacks table.wait(), status() and
// config(), so there Create works by name and cannot check durability.
package rethink
