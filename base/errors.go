package base

import (
	"errors"

	"github.com/leaderfeed/leaderfeed/base/backend"
)

// Errors of Feed and Elections. Match them with errors.Is.
var (
	// ErrClosed: the feed, the Elections or its store was closed or
	// stopped (the same value as backend.ErrClosed).
	ErrClosed = backend.ErrClosed
	// ErrInvalidConfig: a constructor was given options, names or timings
	// it cannot use, or Start or Create found the store unlike the options
	// say (the same value as backend.ErrInvalidConfig).
	// heartbeat.ErrInvalidTiming and heartbeat.ErrInvalidRecord errors
	// returned by this module also match it.
	ErrInvalidConfig = backend.ErrInvalidConfig
	// ErrRefused: the store refuses the operation and retrying cannot fix
	// it: a missing privilege, failed authentication, a missing or foreign
	// table (the same value as backend.ErrRefused). A Feed fails Start with
	// it, and while running logs it, reports it in Health and retries the
	// refused kind of call only every five ElectionTimeoutMax (see Feed).
	ErrRefused = backend.ErrRefused

	// ErrNotLeader: Resign, Proclaim or TransferTo was called on a node
	// that is not the leader.
	ErrNotLeader = errors.New("leaderfeed: not the leader")
	// ErrAlreadyStarted: Start was called twice.
	ErrAlreadyStarted = errors.New("leaderfeed: already started")
	// ErrNotStarted: a call needs a started feed.
	ErrNotStarted = errors.New("leaderfeed: not started")
	// ErrObserveOnly: the feed was created to observe and never leads.
	ErrObserveOnly = errors.New("leaderfeed: observe-only feed")
	// ErrSlowReader: a subscription's reader fell too far behind (4,096
	// events) and the subscription was ended.
	ErrSlowReader = errors.New("leaderfeed: subscription ended: its reader fell too far behind")
	// ErrUnhealthy is matched by the errors of Feed.Healthy that report a
	// wedged feed.
	ErrUnhealthy = errors.New("leaderfeed: unhealthy")
	// ErrDuplicateID is matched by the EventError and the Healthy error
	// of a Feed that saw a record written by another process with its
	// node id. Safety does not rest on unique ids (each process writes its
	// own incarnation, heartbeat.Record.Incarnation), but two processes
	// with one id are two nodes that logs, Participants and transfers
	// cannot tell apart: give each process an id of its own.
	ErrDuplicateID = errors.New("leaderfeed: node id is used by another process")
)

// Errors of TransferTo. Each also names the node in its message.
var (
	// ErrTransferToSelf: the leader was asked to transfer to itself.
	ErrTransferToSelf = errors.New("leaderfeed: transfer to the leader itself")
	// ErrUnknownParticipant: the target is not a live participant of the
	// election (it does not participate, or its presence expired).
	ErrUnknownParticipant = errors.New("leaderfeed: transfer target is not a live participant")
	// ErrTargetCannotLead: the target participates but is observe-only:
	// it never claims, so a transfer to it would cost an election timeout.
	ErrTargetCannotLead = errors.New("leaderfeed: transfer target is observe-only")
)

// Causes of the end of a leader context, given by context.Cause on the
// leader context of a term (Event.LeaderCtx, Feed.LeaderContext, Run).
var (
	// ErrResigned: Resign was called.
	ErrResigned = errors.New("leaderfeed: leadership ended: resigned")
	// ErrDeposed: another node took over, or the record was deleted.
	ErrDeposed = errors.New("leaderfeed: leadership ended: deposed")
	// ErrLeaseExpired: no renewal got through before the lease ran out.
	ErrLeaseExpired = errors.New("leaderfeed: leadership ended: lease expired")
	// ErrStopped: Stop was called.
	ErrStopped = errors.New("leaderfeed: leadership ended: stopped")
	// ErrTransferred: leadership was handed to another node (TransferTo,
	// or a participant of higher Priority).
	ErrTransferred = errors.New("leaderfeed: leadership ended: transferred")
)

// ErrFenced is matched by the errors of a backend's Fence (postgres.Fence,
// mongo.Fence): the write it guards would land after the term it names
// ended, because the election's record names another term, no leader, or
// is missing, or (under snapshot isolation) the record changed after the
// transaction's snapshot. The transaction must not commit; the message
// names the election, the term asked and the term found.
var ErrFenced = errors.New("leaderfeed: fenced: the term has ended")
