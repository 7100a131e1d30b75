package backend

import (
	"context"
	"time"

	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// Store is what a backend implements: one table (or collection) of
// election records, any number of elections in it keyed by name, and the
// table's changefeed. It keeps the verbs of an Election, with the election as
// a key: base.Elections turns one Store into an Election per election, shares the
// Store's one changefeed among them, and batches their writes when the
// Store can (BatchStore).
//
// Every method must honour ctx: when ctx is done it returns promptly with an
// error that matches ctx.Err() under errors.Is. Methods other than Start,
// Create and Close may be called concurrently. Stores do not retry; the
// Feed decides what to retry and when. A Store never closes the database
// client it was given; the caller owns that.
//
// docs/EXTENDING.md explains the contract in full, and base/basetest checks
// it.
type Store interface {
	// Start connects and checks that the server can do what the store
	// needs, and fails with a clear error (matching ErrUnsupported) if not.
	Start(ctx context.Context) error

	// Create creates what is missing (database, table, trigger, index) if
	// the store's options allow it, and otherwise checks that it exists.
	// It is idempotent and safe to run from many processes at once.
	Create(ctx context.Context) error

	// Get returns the current record of election, with the same errors as
	// Election.Get (ErrNotFound, ErrMalformedRecord).
	Get(ctx context.Context, election string) (heartbeat.Record, error)

	// Heartbeat is the compare-and-set write of the record next.Election,
	// exactly as Election.Heartbeat: it compares the stored record's
	// identity (revision, leader, term) with expected's.
	Heartbeat(ctx context.Context, expected, next heartbeat.Record) (heartbeat.Record, error)

	// Subscribe opens the changefeed of the table: every committed change
	// of every election record (RecordChanged with Record.Election set;
	// RecordDeleted and Ignored with Election set), in commit order per
	// election, and every change to the application's records of the
	// watched table (OtherChanged). It returns once the feed listens, so
	// that every change committed after Subscribe returns is delivered.
	//
	// The store sends on the channel and blocks while nobody reads: it
	// queues nothing and coalesces nothing (Elections does both, once for
	// all stores). It closes the channel when ctx is done (every send
	// selects on ctx.Done()) or after sending one Failed notification.
	// A record too large for the store's notification is read and sent
	// whole, or reported as Ignored if it cannot be.
	Subscribe(ctx context.Context) (<-chan Notification, error)

	// Close releases what the store holds (never the caller's client). It
	// is idempotent; afterwards every method returns an error matching
	// ErrClosed, and open subscriptions end.
	Close() error
}

// Write is one compare-and-set of a batch: Next is stored if the record of
// Next.Election is the write Expected names.
type Write struct {
	Expected heartbeat.Record
	Next     heartbeat.Record
}

// WriteResult is the outcome of one Write of a batch: the stored record, or
// the error a single Heartbeat would have returned (a *ConflictError with
// the current record, an error matching ErrMalformedRecord, ...).
type WriteResult struct {
	Record heartbeat.Record
	Err    error
}

// BatchStore is a Store that can write many elections' records at once, in
// one round trip (PostgreSQL: one UPDATE ... FROM unnest(...), with an
// INSERT ... SELECT ... FROM unnest(...) for first claims). It is an
// optional capability, discovered by type assertion as in database/sql/driver:
// Elections uses it to renew every due election of the process together.
type BatchStore interface {
	Store
	// HeartbeatBatch performs the writes, each with exactly the semantics
	// of Heartbeat, and returns one result per write, in order. base's
	// Elections sends only writes that pass heartbeat.ValidateWrite and
	// name distinct elections; a store checks them all the same (with its
	// own integer range and heartbeat.Batch) and fails a write that breaks
	// them alone. It may apply some writes and refuse others;
	// each result says which. An error (with nil results) means the
	// outcome of every write is unknown, as for a Heartbeat that failed.
	HeartbeatBatch(ctx context.Context, writes []Write) ([]WriteResult, error)
}

// ReadResult is the outcome of one election of a GetBatch: the record, or
// the error a single Get of that election would have returned (an error
// matching ErrNotFound when the election has no record, ErrMalformedRecord
// when its record cannot be decoded).
type ReadResult struct {
	Record heartbeat.Record
	Err    error
}

// BatchReader is a Store that can read many elections' records at once,
// in one round trip (PostgreSQL: one SELECT ... WHERE election = ANY(...)).
// It is an optional capability, discovered by type assertion as
// BatchStore is: Elections uses it when many elections read at once, as
// they do when the shared changefeed failed and every election's Feed
// reopens it and reads its record.
type BatchReader interface {
	Store
	// GetBatch returns one result per election, in order; the elections
	// are distinct. Each result is what Get would return for it: an
	// election without a record gets an error matching ErrNotFound, and
	// a malformed record fails only its own election. An error (with nil
	// results) means no record could be read.
	GetBatch(ctx context.Context, elections []string) ([]ReadResult, error)
}

// Aligner is an Election that places renewals on a grid, so that the
// renewals of many elections fall on a few instants and share batches (the
// Elections of package base give such Elections). A Feed asks it when to
// send the renewal due at due: the answer, if not after due and less than
// interval before it, is when the Feed renews. Renewing early is safe: a
// lease runs from its renewal's send time. Wrappers forward it.
type Aligner interface {
	Election
	AlignRenewal(due time.Time, interval time.Duration) time.Time
}

// Submitter is an Election that takes a claim or renewal without blocking
// and hands its result to done later, on a goroutine of its own (a
// batching Elections of package base), so that a Feed needs no goroutine
// per write. ctx is the Feed's (it ends when the Feed stops), deadline
// bounds the call; done gets the result once, by deadline at the latest,
// with the semantics of Heartbeat, and must not block. SubmitHeartbeat
// reports false when it does not take the write; the Feed then calls
// Heartbeat. Wrappers forward it or report false.
type Submitter interface {
	Election
	SubmitHeartbeat(ctx context.Context, deadline time.Time, expected, next heartbeat.Record, done func(heartbeat.Record, error)) bool
}

// FuncSubscriber is an Election or a Store whose changefeed hands each
// notification to a function instead of a channel (the Elections of package
// base give such Elections; package postgres such a Store), so that
// neither a Feed nor an Elections needs a goroutine to read a channel, and
// a notification reaches the engine one goroutine hop sooner.
// SubscribeFunc calls deliver with what Subscribe would send, in order and
// never two at once, on a goroutine of the implementation's; deliver must
// not block. Failed is the last. ctx bounds the call only: the
// subscription ends when cancel is called, which the caller must do (not
// from deliver), and deliver is not called once cancel has returned. A
// Feed or an Elections uses it instead of Subscribe. Wrappers forward it.
type FuncSubscriber interface {
	SubscribeFunc(ctx context.Context, deliver func(Notification)) (cancel func(), err error)
}
