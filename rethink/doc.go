// Package rethink is a leaderfeed backend for RethinkDB, over the driver
// gopkg.in/rethinkdb/rethinkdb-go.v6.
//
// A Store (NewStore) is one table: the records of any number of elections,
// each one document keyed by the election's name in the primary key "id",
// and one changefeed on the table for all of them, which base.Elections
// shares among the elections of a process while batching their renewals.
// New(session, election, opts) is the backend of a lone election (base.Open
// on a Store of its own). The caller passes the *r.Session it owns; no Store
// ever closes it. Other documents of the table are the caller's: their
// changes arrive as change events, as in the original JavaScript
// leaderfeed.
//
//	session, err := r.Connect(r.ConnectOpts{Address: "db:28015"})
//	b, err := rethink.New(session, "scheduler", rethink.Options{Logger: slog.Default()})
//	feed, err := base.New(b, nodeID, base.Options{})
//
// Store implements backend.Store, backend.BatchStore (one
// getAll(...).update(...) for many renewals), backend.BatchReader and
// backend.PresenceStore, not backend.PresenceBatchStore: base.Elections
// writes each presence refresh, and reads each election's participants,
// as a call of its own. Every write is one single-document operation that
// RethinkDB executes atomically (an insert with conflict "error" for the
// first claim, then an update function that compares revision, leader and
// term), asks for durability "hard", and is stamped with r.now(). If the
// driver retries a compare-and-set whose reply was lost, Heartbeat
// recognises its own write and returns it as success.
//
// Create creates the database (default "leaderfeed") and the table
// (default "leaderfeed") when missing, unless Options.NoCreate is set. On a
// real RethinkDB, concurrent creators can leave duplicate databases or
// tables, after which every query naming them fails as "ambiguous"; Create
// finds them in the system tables, keeps the same one in every process,
// drops the others (logged at Warn), and never drops a duplicate database
// that holds other tables (backend.ErrInvalidConfig). Store.Create says why
// records in a dropped duplicate cannot make two leaders.
//
// What it needs: read and write on the table; to create, the config
// permission; the admin user to resolve duplicates and check durability
// (without it Create warns and works by name only). Database and table
// names match ^[A-Za-z0-9_-]+$ (at most MaxTableNameLen bytes, not
// "rethinkdb"). Terms and revisions are exact up to 2^53. Refusals (bad
// credentials, a missing permission, a missing database or table, a table
// with another primary key) match base.ErrRefused and carry the fix.
//
// Fencing: RethinkDB has no multi-document transactions, so nothing can
// make a write to another document wait for the election's record, and
// the package has no Fence. The resource fences itself instead: it keeps
// the term of its last writer in a field of its own document ("term"
// here), and every write of the leader is one atomic single-document
// update that checks it, so that a write of an older term is refused:
//
//	res, err := r.Table("jobs").Get(jobID).Update(func(row r.Term) r.Term {
//		return r.Branch(row.Field("term").Default(0).Le(term),
//			map[string]any{"term": term, "state": "done"},
//			r.Error("fenced: the resource holds a newer term"))
//	}, r.UpdateOpts{Durability: "hard"}).RunWrite(session)
//
// A deposed leader's write then fails as soon as a newer leader wrote the
// same document; until then it lands, so the newer leader must write each
// document it takes over (its term) before relying on it. Each document is
// fenced alone: a write spanning documents is not atomic. RunWrite
// returns the r.Error as an error. reqlite, the stand-in CI runs, does not
// run update functions atomically across connections: only a real
// RethinkDB gives this guarantee.
//
// docs/OPERATING.md in the repository has the details: the document, the
// writes and batches, how concurrent creators converge, durability, the
// driver's known data race, and what was tested where (a real RethinkDB
// 2.4.4 outside CI; reqlite, which is not atomic, in CI).
package rethink
