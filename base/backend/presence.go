package backend

import (
	"context"
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
	// Timestamp is when the record was last refreshed, in the store's own
	// clock (set by the store; ignored by Present).
	Timestamp time.Time
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
	// in election, stamped with the store's current time.
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
