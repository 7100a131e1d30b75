// Package mongo is the MongoDB backend of leaderfeed: the election record is
// one document in a collection of the caller's database, and every node
// learns of its changes through a MongoDB change stream on that collection.
//
// # Using it
//
// The caller owns the client and passes a *mongo.Database of the official
// driver (go.mongodb.org/mongo-driver, v1) to New; the backend never
// disconnects it:
//
//	client, err := mongo.Connect(ctx, options.Client().ApplyURI(url))
//	...
//	b, err := lfmongo.New(client.Database("app"), "scheduler", lfmongo.Options{})
//	feed, err := base.New(b, nodeID, base.Options{})
//
// NewLungo takes a lungo.IDatabase instead: either lungo's in-process
// engine (github.com/256dpi/lungo), for tests and single-process programs,
// or lungo's wrapper of the real driver.
//
// # The document
//
// Each election is one document in the collection (default "leaderfeed"),
// with the election name as _id, beside any documents of the caller's own:
//
//	{_id: "<election>", leaderfeed: 1, leader: "<node id>", term: <int64>,
//	 revision: <int64>, ts: <date>, value: <binary>}
//
// The field leaderfeed: 1 marks the document as an election record. A
// document with the election's _id that lacks the mark or breaks the record
// rules (for example {_id: "<election>", leader: 5}) is malformed: Get
// returns an error matching base.ErrMalformedRecord, the change stream
// reports it as base.Ignored and goes on, and no compare-and-set overwrites
// it: Heartbeat then fails with an error matching base.ErrMalformedRecord
// (not a conflict, since there is no record to carry). The election cannot
// proceed until someone deletes that document.
//
// # Guarantees
//
//   - Every write is one FindOneAndUpdate whose filter is {_id, leaderfeed: 1,
//     revision: expected}, with $set for the fields, $inc for the revision
//     and $currentDate for ts, so the server executes the compare-and-set
//     atomically and ts comes from the server's clock (millisecond
//     precision). The first claim (expected revision 0) is an upsert; when
//     another node's upsert wins the race, the loser's insert fails on the
//     unique _id index and Heartbeat returns a *base.ConflictError.
//   - The change stream delivers the election record's changes in commit
//     order. Update events are completed with the document as it is when the
//     stream reads the event (fullDocument: updateLookup), so on a real
//     server an update can be reported with a later revision than the one it
//     wrote; intermediate revisions may then be skipped, never reordered:
//     between two RecordDeleted notifications the revisions of RecordChanged
//     notifications strictly increase.
//   - Other documents of the collection arrive as base.OtherChanged, with
//     _id and the document as relaxed extended JSON. Change.Old is always
//     nil (MongoDB gives no pre-image without collection options this
//     backend does not set). An update whose document was deleted before
//     the stream read it carries New == nil and Partial == true.
//   - The backend keeps the resume token of the last event it delivered, so
//     a stream reopened by a new call of Subscribe misses nothing. When the
//     token is no longer valid (the oplog rolled over) or there is none, the
//     new stream starts at the present: Subscribe then re-reads the record
//     and delivers it first (RecordChanged, or RecordDeleted when there is
//     none), and logs the gap at Warn on Options.Logger: changes to other
//     documents during the gap are lost.
//   - Start fails with an error matching base.ErrUnsupported when the server
//     is a standalone mongod: change streams need a replica set (a
//     single-node replica set will do) or a sharded cluster.
//
// # Limits
//
// Collection names must be valid MongoDB names: non-empty, without '$' or
// NUL, not starting with "system.", and the namespace "<db>.<collection>"
// at most 255 bytes. Change events larger than 16 MiB (a user document near
// the BSON limit, whose change event also carries it) end the stream on a
// real server. Terms and revisions are stored as int64.
//
// Safety needs writes that survive a failover: use majority write concern
// (the driver's default since MongoDB 5.0) for the database you pass. A
// write acknowledged by the primary alone can be rolled back when another
// member is elected, and then one revision can be handed out twice.
//
// # lungo
//
// The store code runs unchanged against lungo v0.4.0, which the tests use in
// every run. Where lungo differs from a real server, the code keeps to what
// both do: it watches with an empty pipeline and filters in the client
// (lungo panics on a non-empty one); it uses no $$NOW, $expr, aggregation
// or pipeline update; it detects duplicate keys with
// lungo.IsUniquenessError, which matches both; it passes only options lungo
// supports or ignores (lungo panics on the others); it treats a stream that
// ends with Err() == nil (lungo's engine closed) as failed. Start runs the
// hello command only on the real driver (lungo has no RunCommand, and always
// supports change streams). lungo runs in-process only: it proves nothing
// about several processes.
//
// # Running the tests against a real server
//
// The tests look for a server in this order:
//
//  1. LEADERFEED_MONGO_URL, for example
//     LEADERFEED_MONGO_URL='mongodb://localhost:27017/?replicaSet=rs0'
//     go test ./mongo/... — the server must be a replica set; the tests use
//     the database leaderfeed_test and drop the collections they create.
//  2. Docker, through testcontainers-go: a mongo:7 container started as a
//     single-node replica set (set LEADERFEED_NO_DOCKER=1 to skip it).
//  3. lungo, in-process, always available.
//
// A single-node replica set for local runs:
//
//	docker run -d --name lf-mongo -p 27017:27017 mongo:7 --replSet rs0
//	docker exec lf-mongo mongosh --quiet --eval \
//	  'rs.initiate({_id: "rs0", members: [{_id: 0, host: "localhost:27017"}]})'
//	LEADERFEED_MONGO_URL='mongodb://localhost:27017/?replicaSet=rs0' go test -race ./mongo/...
package mongo
