package backend

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// Priorities of a Feed's Options.Priority and Presence.Priority.
const (
	// MinPriority is the lowest priority: a node that should lead only
	// when nothing else can (a canary).
	MinPriority = -100
	// MaxPriority is the highest priority.
	MaxPriority = 100
)

// Presence is one participant of an election, as its presence record
// holds it: written by the participant every presence interval
// (Options.Participate), in the store of the election records, under a key
// that can never be an election's (see PresenceStore).
type Presence struct {
	// Node is the participant's node id.
	Node string
	// Value is the participant's Options.Value (at most
	// heartbeat.MaxValueLen bytes).
	Value []byte
	// Priority is the participant's Options.Priority, in [MinPriority,
	// MaxPriority].
	Priority int
	// CanLead is false for an observe-only participant: it never claims
	// and is never a transfer target.
	CanLead bool
	// Token is a number in [1, heartbeat.MaxToken] that the participant
	// draws afresh for every write of its presence record, or 0 from a
	// participant of an older version. A leader hands the election to a
	// participant in one write (heartbeat.Record.Handover) only with a
	// token it read.
	Token uint64
	// Incarnation is the participant's process life: the Feed's
	// heartbeat.Record.Incarnation, in [1, heartbeat.MaxToken], or 0 from
	// a participant of an older version. Joined is kept while it stays
	// the same.
	Incarnation uint64
	// Timestamp is when the record was last refreshed, in the store's own
	// clock (set by the store; ignored by Present).
	Timestamp time.Time
	// Joined is when this incarnation of the participant first wrote its
	// record, in the store's own clock (set by the store; ignored by
	// Present): a write whose Incarnation differs from the stored
	// record's, or that creates the record, sets it to the write's
	// Timestamp; a write of the same Incarnation keeps it. A leader hands
	// over to the participant that joined most recently (after priority),
	// so that the new nodes of a rolling restart lead before the old ones
	// that are stopped next. Zero when the store kept none (a record of
	// an older version).
	Joined time.Time
}

// Validate checks the fields a participant writes.
func (p Presence) Validate() error {
	if err := heartbeat.ValidateName("participant node id", p.Node); err != nil {
		return err
	}
	if len(p.Value) > heartbeat.MaxValueLen {
		return fmt.Errorf("%w: presence value of %q is %d bytes, more than MaxValueLen (%d)", heartbeat.ErrInvalidRecord, p.Node, len(p.Value), heartbeat.MaxValueLen)
	}
	if p.Token > heartbeat.MaxToken {
		return fmt.Errorf("%w: presence token %d of %q exceeds heartbeat.MaxToken", heartbeat.ErrInvalidRecord, p.Token, p.Node)
	}
	if p.Incarnation > heartbeat.MaxToken {
		return fmt.Errorf("%w: presence incarnation %d of %q exceeds heartbeat.MaxToken", heartbeat.ErrInvalidRecord, p.Incarnation, p.Node)
	}
	if p.Priority < MinPriority || p.Priority > MaxPriority {
		return fmt.Errorf("%w: priority %d of %q is outside [%d, %d]", heartbeat.ErrInvalidRecord, p.Priority, p.Node, MinPriority, MaxPriority)
	}
	return nil
}

// PresenceStore is a Store that keeps presence records: an optional
// capability, discovered by type assertion like BatchStore. Presence
// records live in the table of the election records, under a key that can
// never be an election name (election names and node ids contain no
// control character, so "<election>\x1f<node>" is safe), and they are
// never announced as election records on the changefeed: a presence
// refresh must not wake the followers of the election. The cost is one
// write per participant per presence interval, and one read per leader
// per interval when the leader participates (the Priority check).
type PresenceStore interface {
	Store
	// Present writes (inserts or replaces) the presence record of p.Node
	// in election, stamped with the store's current time, and sets or
	// keeps its Joined time (see Presence.Joined) in the same atomic
	// write.
	Present(ctx context.Context, election string, p Presence) error
	// Absent deletes the presence record of node in election; a missing
	// one is no error.
	Absent(ctx context.Context, election, node string) error
	// Participants returns every presence record of election, live or
	// not, with the store's current time, read in one statement where the
	// store can: liveness is judged by comparing the records' Timestamps
	// with it, in the store's own clock. Malformed records are left out.
	Participants(ctx context.Context, election string) ([]Presence, time.Time, error)
}

// PresenceWrite is one presence write of a batch: the presence record of
// Presence.Node in Election.
type PresenceWrite struct {
	Election string
	Presence Presence
}

// ParticipantsResult is the outcome of one election of a
// ParticipantsBatch: what Participants would return for it.
type ParticipantsResult struct {
	Presences []Presence
	Now       time.Time // the store's time
	Err       error
}

// PresenceBatchStore is a PresenceStore that can write many presence
// records at once, and read the participants of many elections at once,
// each in one round trip (PostgreSQL: one INSERT ... SELECT ... FROM
// unnest(...) ON CONFLICT DO UPDATE; one SELECT). It is an optional
// capability, discovered by type assertion as BatchStore is: Elections
// uses it to refresh the presence records of its elections together, and
// to read the participants its leaders check, so that participating costs
// a few statements per presence interval for the process, not two per
// election.
type PresenceBatchStore interface {
	PresenceStore
	// PresentBatch performs the writes, each with exactly the semantics
	// of Present (stamped with the store's current time, never announced
	// on the changefeed), and returns one error per write, in order (nil:
	// written). base's Elections sends only valid writes that name each
	// (election, node) once; a store checks them all the same and fails
	// a write that breaks Presence.Validate or heartbeat.ValidateName, or
	// names an (election, node) that a write before it names, alone. An
	// error (with nil results) means the outcome of every write is
	// unknown, as for a Present that failed.
	PresentBatch(ctx context.Context, writes []PresenceWrite) ([]error, error)
	// ParticipantsBatch returns one result per election, in order, each
	// what Participants would return for it (an election without
	// presence records has none, and no error); the store's time may be
	// one reading for all. base's Elections sends distinct valid names; a
	// store checks them all the same (heartbeat.Batch) and fails a bad or
	// repeated one alone. An error (with nil results) means nothing could
	// be read.
	ParticipantsBatch(ctx context.Context, elections []string) ([]ParticipantsResult, error)
}

// PresenceBatch indexes the writes of a batch of presence writes by
// PresenceKey, as heartbeat.Batch does a batch of records, for stores to
// check a batch with.
type PresenceBatch map[string]int

// Add admits write i of the batch: nil when it names a valid election
// (heartbeat.ValidateName) and a valid presence (Presence.Validate) of an
// (election, node) that no write added before names; otherwise an error
// matching heartbeat.ErrInvalidRecord, and write i must fail alone.
func (b PresenceBatch) Add(w PresenceWrite, i int) error {
	if err := heartbeat.ValidateName("election name", w.Election); err != nil {
		return err
	}
	if err := w.Presence.Validate(); err != nil {
		return err
	}
	key := PresenceKey(w.Election, w.Presence.Node)
	if first, dup := b[key]; dup {
		return fmt.Errorf("%w: the presence of %q in election %q is named by writes %d and %d of one batch; a batch names each once", heartbeat.ErrInvalidRecord, w.Presence.Node, w.Election, first, i)
	}
	b[key] = i
	return nil
}

// PresenceElection is the presence capability of one Election
// (those Elections gives always have it; their calls fail with an error
// matching ErrUnsupported when the Store is not a PresenceStore).
type PresenceElection interface {
	Election
	Present(ctx context.Context, p Presence) error
	Absent(ctx context.Context, node string) error
	Participants(ctx context.Context) ([]Presence, time.Time, error)
}

// PresenceKey is the key of the presence record of node in election in
// stores that keep presence records beside the election records:
// "<election>\x1f<node>". No election name contains a control character
// (heartbeat.ValidateName), so it never is an election's key.
func PresenceKey(election, node string) string { return election + PresenceSep + node }

// PresenceSep separates the election and the node in PresenceKey.
const PresenceSep = "\x1f"

// IsPresenceKey reports whether a key of the election table is a presence
// record's (it holds PresenceSep), so that changefeeds skip it.
func IsPresenceKey(key string) bool { return strings.Contains(key, PresenceSep) }

// ErrNotPresent: a guarded write (GuardStore) found no presence record of
// the guard's node with the guard's incarnation, and wrote nothing.
var ErrNotPresent = errors.New("leaderfeed: the guard's participant is not present")

// Guard names the presence record a guarded write requires: that of
// Node with Incarnation (backend.Presence.Incarnation), in the election
// of the write.
type Guard struct {
	Node        string
	Incarnation uint64
}

// GuardStore is a PresenceStore whose compare-and-set can require a
// presence record in the same atomic step: an optional capability,
// discovered by type assertion like BatchStore. A leader hands its
// election over with it, from its last read of the participants instead
// of a read at that moment: the write names a participant that has not
// withdrawn, or it is not made.
type GuardStore interface {
	PresenceStore
	// HeartbeatGuarded is Heartbeat (expected.Revision is never 0) that
	// also requires the presence record of guard.Node in next.Election,
	// with guard.Incarnation, to exist when the write commits; a record
	// of another incarnation does not count, nor does its age. A
	// concurrent Absent of that record commits either before the write,
	// which then writes nothing, or after it, so that a read of the
	// election record after the Absent returned sees the write. When the
	// compare-and-set finds another record, it returns a *ConflictError
	// as Heartbeat does; when it finds the expected one but no such
	// presence record, it writes nothing and returns an error matching
	// ErrNotPresent.
	HeartbeatGuarded(ctx context.Context, expected, next heartbeat.Record, guard Guard) (heartbeat.Record, error)
}

// GuardElection is the guarded write of one Election (those Elections
// gives always have it; it fails with an error matching ErrUnsupported,
// without I/O, when the Store is not a GuardStore). Wrappers forward it.
type GuardElection interface {
	Election
	HeartbeatGuarded(ctx context.Context, expected, next heartbeat.Record, guard Guard) (heartbeat.Record, error)
}
