// Package mongo is the MongoDB backend of leaderfeed: each election's record
// is one document in a collection of the caller's database, and every node
// learns of their changes through one MongoDB change stream on that
// collection.
//
// # Using it
//
// The caller owns the client of the official driver
// (go.mongodb.org/mongo-driver/v2) and passes a *mongo.Database (or a
// *mongo.Collection); the package never disconnects it. One election:
//
//	import (
//		"go.mongodb.org/mongo-driver/v2/mongo"
//		"go.mongodb.org/mongo-driver/v2/mongo/options"
//
//		"github.com/leaderfeed/leaderfeed/base"
//		lfmongo "github.com/leaderfeed/leaderfeed/mongo"
//	)
//
//	client, err := mongo.Connect(options.Client().ApplyURI(url))
//	...
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
// Store implements backend.Store and backend.BatchStore; New is base.Open on a
// Store of its own. NewStore and New check the names but do no I/O.
//
// There is no entry point for the driver v1 (go.mongodb.org/mongo-driver),
// which MongoDB has deprecated: a program still on v1 can open a v2 client
// beside its v1 one for leaderfeed (the two modules live side by side). So
// a service importing this package gets neither v1 nor lungo in its go.sum.
//
// Package github.com/leaderfeed/leaderfeed/mongo/onlungo (a module of its
// own) runs the same backend on lungo's in-process engine, for tests and
// examples without a server.
//
// # The document
//
// Each election is one document in the collection (default "leaderfeed"),
// with the election name as _id, beside any documents of the caller's own
// and the other elections':
//
//	{_id: "<election>", leaderfeed: 1, leader: "<node id>", term: <int64>,
//	 revision: <int64>, ts: <date>, value: <binary>, lease_us: <int64>}
//
// lease_us is the writer's lease (heartbeat.Record.Lease) in whole
// microseconds, rounded up; 0 when vacant. A document written before the
// field existed lacks it and is a record with Lease 0; a lease on a vacant
// document (left by such an older writer's $set) is ignored.
//
// The field leaderfeed: 1 marks the document as an election record. A
// document with the election's _id that lacks the mark or breaks the record
// rules (for example {_id: "<election>", leader: 5}) is malformed: Get
// returns an error matching backend.ErrMalformedRecord, the change stream
// reports it as backend.Ignored (with Notification.Election) and goes on, and
// no compare-and-set overwrites it: Heartbeat then fails with an error
// matching backend.ErrMalformedRecord (not a conflict, since there is no record
// to carry). The election cannot proceed until someone deletes that
// document. A malformed document of one election never affects another's
// reads, writes or notifications.
//
// The change stream tells election documents from the caller's by the
// mark: a document with a leaderfeed field is an election's (a
// RecordChanged, or Ignored when malformed), and so is any document under
// an _id the Store knows as an election's (one it was asked to Get or
// Heartbeat, or saw with the mark: the documents with the mark are read
// when the first stream opens). Every other document is the caller's
// (OtherChanged). A deletion carries only the _id: it is a RecordDeleted
// when the _id is known as an election's, else an OtherChanged.
//
// # Guarantees
//
//   - A Store opens one change stream for all its elections, whatever
//     their number (base.Elections opens one Store.Subscribe per Store).
//     It sends each notification as it reads it, blocking while nobody
//     reads: it queues and coalesces nothing (base does both).
//   - Every single write is one FindOneAndUpdate whose filter is {_id, leaderfeed: 1,
//     revision: expected.Revision, leader: expected.Leader, term:
//     expected.Term} (the write's identity, not the revision alone, so that
//     a revision handed out twice after a lost write is told apart), with
//     $set for the fields, $inc for the revision
//     and $currentDate for ts, so the server executes the compare-and-set
//     atomically and ts comes from the server's clock (millisecond
//     precision). The first claim (expected revision 0) is an upsert with
//     the filter {_id, leaderfeed: 1, revision: 0}; when
//     another node's upsert wins the race, the loser's insert fails on the
//     unique _id index and Heartbeat returns a *backend.ConflictError.
//   - HeartbeatBatch writes many elections' records in two round trips:
//     one unordered BulkWrite of UpdateOne operations (the filters and
//     updates above; upserts for first writes), and one Find of
//     {_id: {$in: [...]}} that reads back the stored documents (the
//     timestamps come from $currentDate), in one causally consistent
//     session. A write is applied when the document read back is the
//     record it wrote (revision expected+1 with its leader, term, value
//     and lease); otherwise its result is what Heartbeat gives: a
//     *backend.ConflictError with the current record (also for an upsert that
//     lost on the duplicate _id), or an error matching
//     backend.ErrMalformedRecord. A write applied and overwritten by another
//     node before the Find reads it is reported as a conflict carrying the
//     newer record: its record was superseded either way. An error of the
//     whole batch (network, write concern) leaves every write's outcome
//     unknown, as for a Heartbeat that failed.
//   - The elections' writes use write concern majority, and its reads read
//     concern majority on the primary, whatever the client, database or
//     collection passed in says: a write acknowledged by the primary alone
//     can be rolled back when another member is elected, and then one
//     revision could be handed out twice. Documents of the caller's own
//     are never written.
//   - The change stream delivers each election record's changes in commit
//     order. Update events are completed with the document as it is when the
//     stream reads the event (fullDocument: updateLookup), so on a real
//     server an update can be reported with a later revision than the one it
//     wrote; intermediate revisions may then be skipped, never reordered:
//     between two RecordDeleted notifications of an election the revisions
//     of its RecordChanged notifications strictly increase.
//   - Other documents of the collection arrive as backend.OtherChanged, with
//     _id and the document as relaxed extended JSON. Change.Old is always
//     nil (MongoDB gives no pre-image without collection options this
//     backend does not set). An update whose document was deleted before
//     the stream read it carries New == nil and Partial == true.
//   - The Store keeps the resume token of the last event it delivered,
//     and while the collection is idle the postBatchResumeToken of each
//     empty batch, so a stream reopened by a new call of Subscribe misses
//     nothing, even after a long quiet time. When the token can no longer
//     be resumed from (error codes 136 CappedPositionLost, 260
//     InvalidResumeToken, 280 ChangeStreamFatalError, 286
//     ChangeStreamHistoryLost: the oplog rolled over) or there is none, the
//     new stream starts at the present: Subscribe then re-reads the record
//     and delivers it first (RecordChanged, or RecordDeleted when there is
//     none), and logs the gap at Warn on Options.Logger: changes to other
//     documents during the gap are lost.
//   - A dropped or renamed collection (or database) is reported as
//     RecordDeleted of every known election; the server then invalidates
//     the stream, and the subscription ends with Failed. The next
//     Subscribe starts at the present and re-reads the records.
//   - Start runs hello (isMaster on servers older than 4.4.2) and fails
//     with an error matching backend.ErrUnsupported when the server is a
//     standalone mongod (no setName, not a mongos answering msg:
//     "isdbgrid"): change streams need a replica set (a single-node
//     replica set will do; the message says how to make one) or a sharded
//     cluster.
//
// # Limits
//
// Collection names must be valid MongoDB names: non-empty, without '$' or
// NUL, not starting with "system.", and the namespace "<db>.<collection>"
// at most 255 bytes. A change event larger than 16 MiB (a user document
// near the BSON limit, whose change event also carries it) fails on the
// server with BSONObjectTooLarge (code 10334); resuming before it would
// meet it again, so the subscription fails, the next stream starts at the
// present and the records are re-read: changes to other documents in
// between are lost, the elections' state is not. Terms and revisions are
// stored as int64.
//
// # Refusals
//
// Unauthorized (code 13), AuthenticationFailed (18) and UserNotFound (11)
// match base.ErrRefused, with the fix: the readWrite role on the database
// (db.grantRolesToUser), or the credentials of the connection string. So
// does a missing collection with NoCreate (db.createCollection). Every
// other error is transient.
//
// # What is tested where
//
// The store's logic runs on a narrow internal interface with two
// adapters: the driver v2 (this package) and lungo (package onlungo).
// Every test run, CI included, runs the store tests (batches included) and
// the conformance suite (the Store rules included) on lungo v0.4.0 through
// the lungo adapter, and this package's
// server-free tests (the driver-v2 adapter's error classification, hello
// checks, record decoding, an update event without its document, a server
// that does not answer). The driver-v2 adapter itself runs the same tests
// only against a real server: when LEADERFEED_MONGO_URL is set, or in the
// containertest module where Docker works (a mongo:7 container). CI has
// neither. Behaviour that only a real server shows is written from the
// server's documentation: hello, majority concerns, postBatchResumeToken,
// the bulk write's per-operation errors, the causally consistent session,
// updateLookup's null document, the error codes above, invalidate on a
// real drop. lungo runs in-process only: it proves nothing about several
// processes.
//
// # Running the tests against a real server
//
// LEADERFEED_MONGO_URL names a replica set; the tests use the database
// leaderfeed_test and drop the collections they create. Without it, the
// real-server tests of this package skip with a one-line reason. A
// single-node replica set for local runs:
//
//	docker run -d --name lf-mongo -p 27017:27017 mongo:7 --replSet rs0
//	docker exec lf-mongo mongosh --quiet --eval \
//	  'rs.initiate({_id: "rs0", members: [{_id: 0, host: "localhost:27017"}]})'
//	cd mongo && LEADERFEED_MONGO_URL='mongodb://localhost:27017/?replicaSet=rs0' go test -race ./...
package mongo
