// Package driver is the narrow interface the MongoDB backend's logic runs
// on, with two implementations: the adapter of the official driver
// (go.mongodb.org/mongo-driver/v2, in package mongo) and the adapter of
// lungo's in-process engine (package mongo/onlungo, a module of its own, so
// that lungo stays out of the go.sum of a service that imports only
// package mongo).
//
// Documents cross the interface as BSON bytes (bson.Raw of the v2 driver),
// so neither side depends on the other's BSON types. Errors that the logic
// must tell apart are matched with errors.Is against the sentinels below;
// an adapter wraps its driver's error with the sentinel and keeps the
// original in the chain.
package driver

import (
	"context"
	"errors"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Sentinels an adapter wraps its errors with.
var (
	// ErrNoDocument: FindOne or FindOneAndUpdate matched no document.
	ErrNoDocument = errors.New("no document")
	// ErrDuplicateKey: an upsert's insert hit an existing _id.
	ErrDuplicateKey = errors.New("duplicate key")
	// ErrHistoryLost: a change stream cannot resume from the token it was
	// given: the position is no longer in the oplog, or the token is not
	// valid (server codes 136 CappedPositionLost, 260 InvalidResumeToken,
	// 280 ChangeStreamFatalError, 286 ChangeStreamHistoryLost; lungo's
	// lost oplog position).
	ErrHistoryLost = errors.New("change stream history lost")
	// ErrEventTooLarge: a change event was larger than the 16 MiB BSON
	// limit (server code 10334 BSONObjectTooLarge). Resuming from the
	// token before it meets the same event again.
	ErrEventTooLarge = errors.New("change event larger than 16 MiB")
	// ErrStreamEnded: the change stream ended without an error (lungo does
	// so when its engine is closed; a server when it closed the cursor).
	ErrStreamEnded = errors.New("change stream ended")
	// ErrInvalidated: the server invalidated the change stream because
	// the collection was dropped or renamed (an invalidate event). The
	// backend ends the stream with it; adapters do not return it.
	ErrInvalidated = errors.New("change stream invalidated: the collection was dropped or renamed")
	// ErrUnauthorized: the user may not run the command (server code 13
	// Unauthorized). Retrying cannot fix it.
	ErrUnauthorized = errors.New("not authorized")
	// ErrAuthFailed: the server refused the credentials (server codes 18
	// AuthenticationFailed, 11 UserNotFound). Retrying cannot fix it.
	ErrAuthFailed = errors.New("authentication failed")
)

// Collection is the collection that holds the election documents, as the
// backend needs it. Implementations are safe for concurrent use.
type Collection interface {
	// DatabaseName and Name name the namespace.
	DatabaseName() string
	Name() string

	// Hello returns the server's answer to the hello command (isMaster
	// on servers that lack hello). An in-process engine that always
	// supports change streams answers as a replica set member.
	Hello(ctx context.Context) (bson.Raw, error)

	// Exists reports whether the collection exists.
	Exists(ctx context.Context) (bool, error)
	// Create creates the collection; nil if it exists already.
	Create(ctx context.Context) error

	// FindOne returns the document with _id id from the primary, read
	// with majority read concern where the store has one; ErrNoDocument
	// when there is none.
	FindOne(ctx context.Context, id string) (bson.Raw, error)

	// FindOneAndUpdate applies update to the document matching filter
	// (inserting one when upsert is set and none matches) with majority
	// write concern where the store has one, and returns the document
	// after the update. ErrNoDocument when nothing matched, ErrDuplicateKey
	// when the upsert's insert lost to an existing document.
	FindOneAndUpdate(ctx context.Context, filter, update bson.D, upsert bool) (bson.Raw, error)

	// Find returns the documents matching filter, read as FindOne reads.
	Find(ctx context.Context, filter bson.D) ([]bson.Raw, error)

	// DeleteOne deletes the document with _id id, with majority write
	// concern where the store has one; nil when there is none.
	DeleteOne(ctx context.Context, id string) error

	// UpdateBatch applies ops in one unordered bulk write (UpdateOne
	// operations, with majority write concern where the store has one),
	// then reads the documents whose _id is in ids with one find, which
	// sees the bulk write's effects (one causally consistent session on a
	// server). An error means the outcome of every op is unknown.
	UpdateBatch(ctx context.Context, ops []UpdateOp, ids []string) (BatchResult, error)

	// Watch opens a change stream on the collection with fullDocument:
	// updateLookup and an empty pipeline, after resumeAfter when it is not
	// nil. ErrHistoryLost when the token can no longer be resumed from.
	Watch(ctx context.Context, resumeAfter bson.Raw) (Stream, error)
}

// UpdateOp is one UpdateOne operation of UpdateBatch.
type UpdateOp struct {
	Filter, Update bson.D
	Upsert         bool
}

// BatchResult is what UpdateBatch did and read.
type BatchResult struct {
	// Errs holds the write error of each op (nil: none), in the order of
	// the ops; an upsert whose insert lost to an existing document is
	// wrapped with ErrDuplicateKey.
	Errs []error
	// Docs are the documents read back after the writes, in any order.
	Docs []bson.Raw
}

// Stream is an open change stream. Next and ResumeToken are called from
// one goroutine; Close may be called from another.
type Stream interface {
	// Next waits for the next change event and returns it; the bytes are
	// the caller's. It returns (nil, nil) when the server answered with an
	// empty batch (then ResumeToken may have moved on: the batch's
	// postBatchResumeToken), and (nil, err) when the stream failed or
	// ended (ErrStreamEnded when it ended without an error). After an
	// error, Next is not called again.
	Next(ctx context.Context) (bson.Raw, error)
	// ResumeToken returns the token to resume after the last event
	// returned, or after the last empty batch; nil if there is none yet.
	ResumeToken() bson.Raw
	// Close closes the stream.
	Close(ctx context.Context) error
}

// NewStore is set by package mongo: it returns a *mongo.Store on c, with
// opts a mongo.Options. It lets package mongo/onlungo make stores on lungo
// without package mongo exporting this interface.
var NewStore func(c Collection, opts any) (any, error)
