// Package mongo is the MongoDB backend of leaderfeed: each election's record
// is one document in a collection of the caller's database, and every node
// learns of their changes through one change stream on that collection.
//
// The caller owns the client of the official driver v2
// (go.mongodb.org/mongo-driver/v2) and passes a *mongo.Database (or, to
// NewCollection, a *mongo.Collection); the package never disconnects it.
//
//	import lfmongo "github.com/leaderfeed/leaderfeed/mongo"
//
//	client, err := mongo.Connect(options.Client().ApplyURI(url))
//	b, err := lfmongo.New(client.Database("app"), "scheduler", lfmongo.Options{})
//	feed, err := base.New(b, nodeID, base.Options{})
//
// Many elections in one process share one Store, and with it one change
// stream and batched renewals:
//
//	store, err := lfmongo.NewStore(client.Database("app"), lfmongo.Options{})
//	els, err := base.NewElections(store, base.ElectionsOptions{})
//	defer els.Close() // closes the store
//	feed, err := els.Feed("partition-7", nodeID, base.Options{})
//
// Store implements backend.Store, backend.BatchStore (one unordered bulk
// write for many renewals), backend.BatchReader and backend.PresenceStore,
// not backend.PresenceBatchStore: base.Elections writes each presence
// refresh, and reads each election's participants, as a call of its own;
// New is base.Open on a Store of its own. NewStore and New check the names
// but do no I/O. Every write is one FindOneAndUpdate whose filter holds the
// expected revision, leader and term, so the server executes the
// compare-and-set atomically, and ts comes from the server's clock. The
// election's writes use write concern majority and its reads read concern
// majority on the primary, whatever the client says: a write acknowledged
// by the primary alone can be rolled back. The change stream resumes where
// it stopped; when its history is lost, the next one starts at the present
// and re-reads the records (changes to other documents in the gap are lost
// and logged, the elections' state is not).
//
// What it needs: a replica set (a single-node one will do) or a sharded
// cluster, since change streams need one (Start refuses a standalone mongod
// with backend.ErrUnsupported and says how to make a replica set), and the
// readWrite role on the database. Other documents of the collection are the
// caller's: their changes arrive as change events (New as relaxed extended
// JSON, Old always nil).
//
// Fencing: a leader that writes into the election's database makes its
// transaction commit only before the next term with Store.Fence (or
// Fence, for a program that made its election with New), called with the
// context of a session's transaction: a conditional write ($inc of the
// field "fence" where the document names a leader in the term) that
// makes every later write of the record wait for the transaction, and the
// transaction fail once the record changed. It fails with
// base.ErrFenced, and the transaction cannot commit. The change stream
// drops the events of these writes: readers see none.
//
// There is no entry point for the deprecated driver v1: a program still on
// v1 opens a v2 client beside it. A service importing this package gets
// neither v1 nor lungo in its go.sum. Package
// github.com/leaderfeed/leaderfeed/mongo/onlungo (a module of its own) runs
// the same backend on lungo's in-process engine, for tests and examples.
//
// docs/OPERATING.md in the repository has the details: the document, the
// writes and batches, the change stream, refusals, limits, and what was
// tested where (lungo in CI; a real replica set only when
// LEADERFEED_MONGO_URL names one).
package mongo
