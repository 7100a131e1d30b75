package backend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// Errors of the contract. Match them with errors.Is; backends wrap them
// with context of their own. Package base exports ErrClosed,
// ErrInvalidConfig and ErrRefused as the same values.
var (
	// ErrConflict: a compare-and-set found another record than expected.
	// Backends return it as a *ConflictError carrying the current record.
	ErrConflict = errors.New("leaderfeed: revision conflict")
	// ErrNotFound: the election record does not exist (yet).
	ErrNotFound = errors.New("leaderfeed: election record not found")
	// ErrMalformedRecord: a record in the store with the election's key could
	// not be decoded or breaks the record rules. It is ignored and reported.
	ErrMalformedRecord = errors.New("leaderfeed: malformed election record")
	// ErrUnsupported: the server lacks a capability the backend needs (for
	// example MongoDB without a replica set, which has no change streams).
	ErrUnsupported = errors.New("leaderfeed: server lacks a required capability")
	// ErrClosed: the store, election or feed was closed or stopped.
	ErrClosed = errors.New("leaderfeed: closed")
	// ErrInvalidConfig: a constructor was given options, names or timings it
	// cannot use, or Start or Create found the store unlike the options
	// say (for example a missing table when creating is not allowed; such
	// errors match ErrRefused too). heartbeat.ErrInvalidTiming and
	// heartbeat.ErrInvalidRecord errors returned by this module also match it.
	ErrInvalidConfig = errors.New("leaderfeed: invalid configuration")
	// ErrRefused: the store refuses the operation; retrying cannot fix it.
	// A missing privilege, failed authentication, a missing database or
	// table, a table of an older or foreign shape. Backends wrap it with
	// the cause and the fix (the GRANT, or how to make the schema); every
	// other failure of a call counts as transient.
	ErrRefused = errors.New("leaderfeed: store refuses")
)

// ConflictError is the error a Store's or Election's Heartbeat returns when the stored
// revision is not the expected one. It matches ErrConflict with errors.Is.
type ConflictError struct {
	// Current is the record in the store when the write was refused.
	// Current.Revision is 0 when there is no record at all.
	Current heartbeat.Record
}

// NewConflict returns a *ConflictError carrying current.
func NewConflict(current heartbeat.Record) *ConflictError { return &ConflictError{Current: current} }

// Error describes the conflict and the current record.
func (e *ConflictError) Error() string {
	if e.Current.Revision == 0 {
		return "leaderfeed: revision conflict: no record in the store"
	}
	return fmt.Sprintf("leaderfeed: revision conflict: store has revision %d (leader %q, term %d)",
		e.Current.Revision, e.Current.Leader, e.Current.Term)
}

// Is makes errors.Is(err, ErrConflict) true.
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

// Election is what a Feed runs on: one election's view of a Store, the
// record named by Election() and the changefeed of that record. Backends
// implement Store, not Election: base.Elections (and base.Open, for a lone
// election) gives each election an Election on a Store, sharing the
// Store's changefeed and batching its writes. Wrappers such as base/faulty
// implement Election around another.
//
// A Feed owns its Election: it calls Start, then Create, then the other
// methods, and Close when it stops. Methods other than Start, Create and
// Close may be called concurrently. Every method must honour ctx: when ctx
// is done it returns promptly with an error that matches ctx.Err() under
// errors.Is. Backends do not retry; the Feed decides what to retry and
// when.
//
// docs/EXTENDING.md explains the contract in full, and base/basetest checks
// it.
type Election interface {
	// Name returns the name of the election, the key of its record.
	Name() string

	// Start connects and checks that the server can do what the backend
	// needs, and fails with a clear error (matching ErrUnsupported) if not.
	Start(ctx context.Context) error

	// Create creates what is missing (database, table, trigger, index) if
	// the backend's options allow it, and otherwise checks that it exists.
	// It is idempotent and safe to run from many processes at once.
	Create(ctx context.Context) error

	// Get returns the current record. It returns an error matching
	// ErrNotFound when there is none, and one matching ErrMalformedRecord
	// when the stored record cannot be decoded or fails
	// heartbeat.Record.Validate.
	Get(ctx context.Context) (heartbeat.Record, error)

	// Heartbeat is the compare-and-set write. Executed atomically by the
	// store: if the stored record is the write expected names (the same
	// Revision, Leader and Term; expected.Revision 0: no record exists), it
	// stores next.Leader, next.Term, next.Value and next.Lease with
	// Revision = expected.Revision+1 and Timestamp = the store's current
	// time, and returns the stored record. Otherwise it writes nothing and
	// returns a *ConflictError carrying the current record.
	//
	// Comparing leader and term as well as the revision is what keeps a
	// deposed writer from overwriting a new leader's record when the store
	// lost an acknowledged write and handed one revision out twice
	// (PostgreSQL with synchronous_commit = off after a crash, a failover to
	// an asynchronous replica). heartbeat.Record.SameWrite is the
	// comparison.
	//
	// If the stored record is malformed (see Get), Heartbeat writes nothing
	// and returns an error matching ErrMalformedRecord: a ConflictError
	// never carries a malformed record.
	//
	// If Heartbeat returns any other error, the write may or may not have
	// happened; the Feed finds out through the feed or Get.
	Heartbeat(ctx context.Context, expected, next heartbeat.Record) (heartbeat.Record, error)

	// Subscribe opens the changefeed on the table. It delivers every
	// committed change of the election record in commit order, or at least
	// the latest one when changes come faster than they are read, and every
	// change to the application's records of the watched table as
	// OtherChanged notifications. Records of other elections are not
	// reported at all (they would be heartbeat noise).
	//
	// The backend closes the channel when ctx is done (every send selects
	// on ctx.Done()) or after sending one Failed notification; nothing is
	// sent after that. A channel that closes without a Failed notification
	// while ctx is live counts as a failure. Subscribe itself returns an
	// error when the feed cannot be opened at all.
	Subscribe(ctx context.Context) (<-chan Notification, error)

	// Close releases what the backend holds (never the caller's client).
	// It is idempotent; afterwards every method returns an error matching
	// ErrClosed, and open subscriptions end.
	Close() error
}

// NotificationType says what a Notification carries.
type NotificationType int

const (
	// RecordChanged: Record holds the election record as committed.
	RecordChanged NotificationType = iota + 1
	// RecordDeleted: the election record was deleted from the store.
	RecordDeleted
	// OtherChanged: Change holds a change to another record of the table.
	OtherChanged
	// Ignored: a record with the election's key was written but is
	// malformed (Err matches ErrMalformedRecord) and was ignored. The feed
	// goes on.
	Ignored
	// Failed: the feed broke; Err says why. It is the last notification.
	Failed
)

// String returns the type's name.
func (t NotificationType) String() string {
	switch t {
	case RecordChanged:
		return "record-changed"
	case RecordDeleted:
		return "record-deleted"
	case OtherChanged:
		return "other-changed"
	case Ignored:
		return "ignored"
	case Failed:
		return "failed"
	}
	return fmt.Sprintf("NotificationType(%d)", int(t))
}

// Notification is one item of a Store's or an Election's changefeed.
type Notification struct {
	// Type says which of the other fields is set.
	Type   NotificationType
	Record heartbeat.Record // RecordChanged
	Change Change           // OtherChanged
	Err    error            // Ignored, Failed
	// Election is the election a RecordDeleted or Ignored notification of
	// a Store's changefeed is about (RecordChanged has Record.Election).
	// An Election's changefeed, which carries one election, may leave it
	// empty.
	Election string
}

// Op is the kind of a change to a record.
type Op int

const (
	// Insert: a record was created.
	Insert Op = iota + 1
	// Update: a record was updated or replaced.
	Update
	// Delete: a record was deleted.
	Delete
)

// String returns "insert", "update" or "delete".
func (o Op) String() string {
	switch o {
	case Insert:
		return "insert"
	case Update:
		return "update"
	case Delete:
		return "delete"
	}
	return fmt.Sprintf("Op(%d)", int(o))
}

// Change is a change to a record of the watched table other than the
// election record. Records are given as JSON (MongoDB documents as relaxed
// extended JSON).
type Change struct {
	// Table is the table or collection the record is in.
	Table string
	// Op is what happened to the record.
	Op Op
	// Key is the record's primary key as JSON (a string, a number, or an
	// array or object for compound keys).
	Key json.RawMessage
	// Old is the record before the change (nil for inserts, and when the
	// store does not provide it). New is the record after the change (nil
	// for deletes).
	Old, New json.RawMessage
	// Partial is true when Old and New were left out because the record
	// was too large for the store's notification; fetch it by Key.
	Partial bool
}
