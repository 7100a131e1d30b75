package base

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/internal/mailbox"
)

// EventType says what an Event reports.
type EventType int

const (
	// EventElected: this node won leadership. Term is the fencing token of
	// the term, LeaderCtx is cancelled the moment the node must stop acting
	// as leader.
	EventElected EventType = iota + 1
	// EventUnelected: this node stopped being leader. Reason says why; At is
	// when its leadership ended.
	EventUnelected
	// EventNewLeader: the election record names a leader (Leader, Term,
	// Value) other than the last one this node announced, or none
	// (Leader == ""), or the leader published a new Value (Proclaim). The
	// first record observed is announced too.
	EventNewLeader
	// EventChange: a record of the watched table other than the election
	// record changed (Change).
	EventChange
	// EventSubscribeStarted: the changefeed was opened (also after it was
	// reopened following an EventSubscribeError).
	EventSubscribeStarted
	// EventSubscribeError: the changefeed failed or could not be opened
	// (Err). The feed reopens it with backoff and reads the record every
	// heartbeat interval meanwhile.
	EventSubscribeError
	// EventIgnored: a malformed or foreign record with the election's key
	// was seen and ignored (Err matches ErrMalformedRecord).
	EventIgnored
	// EventError: a read or write of the record failed (Err); it is retried.
	EventError
)

// String returns the event type's name, as used in logs.
func (t EventType) String() string {
	switch t {
	case EventElected:
		return "elected"
	case EventUnelected:
		return "unelected"
	case EventNewLeader:
		return "new-leader"
	case EventChange:
		return "change"
	case EventSubscribeStarted:
		return "subscribe-started"
	case EventSubscribeError:
		return "subscribe-error"
	case EventIgnored:
		return "ignored"
	case EventError:
		return "error"
	}
	return fmt.Sprintf("EventType(%d)", int(t))
}

// Reason says why a node stopped being leader.
type Reason int

const (
	// ReasonResigned: Resign was called.
	ReasonResigned Reason = iota + 1
	// ReasonStopped: Stop was called.
	ReasonStopped
	// ReasonDeposed: the record shows that another node took over, or a
	// renewal met a revision conflict.
	ReasonDeposed
	// ReasonLeaseExpired: renewals failed until the lease ran out.
	ReasonLeaseExpired
	// ReasonTransferred: TransferTo was called (or the leader handed over
	// to a participant of higher Priority): the node stepped down and
	// handed the election to the successor, or reserved the vacancy for
	// it.
	ReasonTransferred
)

// String returns the reason's name.
func (r Reason) String() string {
	switch r {
	case ReasonResigned:
		return "resigned"
	case ReasonStopped:
		return "stopped"
	case ReasonDeposed:
		return "deposed"
	case ReasonLeaseExpired:
		return "lease-expired"
	case ReasonTransferred:
		return "transferred"
	}
	return fmt.Sprintf("Reason(%d)", int(r))
}

// Event is one thing a Feed reports. Which fields are set depends on Type.
type Event struct {
	// Type says what happened, and so which other fields are set.
	Type EventType
	// At is when it happened, on this process's monotonic clock. For
	// EventElected it is when leadership began; for EventUnelected when it
	// ended (for ReasonLeaseExpired, the end of the lease).
	At time.Time
	// Term is the fencing token: of this node's term for EventElected and
	// EventUnelected, of the announced leader for EventNewLeader.
	Term uint64
	// Leader is the announced leader's id (EventNewLeader), "" when the
	// election is vacant.
	Leader string
	// Value is the announced leader's published value (EventNewLeader).
	Value []byte
	// Record is the record the event reports, with its revision, store
	// timestamp and lease: for EventNewLeader the first record of the
	// announced leader, term and value (renewals are not events; Revision 0
	// when the store holds none), for EventElected the record this node's
	// claim wrote. Readers need not call Feed.Leader for it.
	Record heartbeat.Record
	// Reason: why leadership ended (EventUnelected).
	Reason Reason
	// Change: the change to another record (EventChange).
	Change backend.Change
	// Err: what went wrong (EventSubscribeError, EventIgnored, EventError,
	// and EventUnelected with ReasonLeaseExpired: the last renewal error).
	Err error
	// LeaderCtx is cancelled when this node's leadership of Term ends
	// (EventElected only). Its Err compares the clock with the lease, so
	// it is never nil after the lease ended, even in a process that was
	// paused past it; Done (and contexts derived from LeaderCtx) follow a
	// timer and may lag by the scheduling delay. Work that must not
	// outlive the lease checks LeaderCtx.Err() before each step.
	LeaderCtx context.Context
}

// String returns a short human-readable form of the event.
func (e Event) String() string {
	switch e.Type {
	case EventElected:
		return fmt.Sprintf("elected term=%d", e.Term)
	case EventUnelected:
		if e.Err != nil {
			return fmt.Sprintf("unelected term=%d reason=%s err=%v", e.Term, e.Reason, e.Err)
		}
		return fmt.Sprintf("unelected term=%d reason=%s", e.Term, e.Reason)
	case EventNewLeader:
		if e.Leader == "" {
			return fmt.Sprintf("new-leader <none> term=%d", e.Term)
		}
		return fmt.Sprintf("new-leader %s term=%d", e.Leader, e.Term)
	case EventChange:
		return fmt.Sprintf("change %s %s %s", e.Change.Table, e.Change.Op, e.Change.Key)
	case EventSubscribeStarted:
		return "subscribe-started"
	}
	return fmt.Sprintf("%s: %v", e.Type, e.Err)
}

// hub hands every event to every subscription, in order, without ever
// blocking the engine.
type hub struct {
	maxChanges int
	log        *slog.Logger

	mu       sync.Mutex
	subs     map[*Subscription]struct{}
	finished bool
	dropped  atomic.Uint64 // change events dropped, every subscription together
}

func newHub(maxChanges int, log *slog.Logger) *hub {
	return &hub{maxChanges: maxChanges, log: log, subs: make(map[*Subscription]struct{})}
}

func (h *hub) push(es []Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		s.push(es)
	}
}

// finish ends every subscription once its reader has taken what is queued.
func (h *hub) finish() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.finished = true
	for s := range h.subs {
		s.finish()
	}
	clear(h.subs)
}

func (h *hub) remove(s *Subscription) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.subs, s)
}

// maxPendingEvents bounds the events other than EventChange queued for one
// subscription whose reader does not read. A subscription that falls this
// far behind is ended: its channel closes and Err returns ErrSlowReader. A
// reader that reads never comes near it (leadership changes at most a few
// times per election timeout).
const maxPendingEvents = 4096

// Subscription is one reader's view of a Feed's events: every event from
// the moment it was made, in order. Leadership events (and every other
// kind but EventChange) are never dropped for a reader that reads; change
// events beyond Options.MaxPendingChanges waiting are dropped and counted
// (Dropped). Nothing a reader does, or fails to do, delays the Feed or its
// Stop. Make one with Feed.Subscribe.
type Subscription struct {
	// C delivers the events. It is closed when the subscription's context
	// ends, when Close is called, or after the Feed stopped and the reader
	// has taken every event queued before.
	C <-chan Event

	pipe       *mailbox.Pipe[Event]
	hub        *hub
	maxChanges int
	cancel     context.CancelFunc
	// linger, if set, bounds how long an event queued when the Feed
	// finished waits for the reader: then it and the rest are dropped and
	// counted (Events: a subscription nobody closes). 0: until ctx ends.
	linger time.Duration

	mu       sync.Mutex
	changes  int // change events waiting
	others   int // other events waiting
	dropped  uint64
	finished bool
	err      error
}

func newSubscription(ctx context.Context, h *hub, maxChanges int, linger time.Duration) *Subscription {
	ctx, cancel := context.WithCancel(ctx)
	s := &Subscription{hub: h, maxChanges: maxChanges, cancel: cancel, linger: linger}
	s.pipe = mailbox.NewPipe[Event](ctx, 0, func() { cancel(); h.remove(s) })
	s.pipe.OnSent(s.sent)
	s.C = s.pipe.C()
	return s
}

// push queues es for the reader, in order, as one burst (see
// mailbox.Pipe.PutAll), less the change events beyond maxChanges.
func (s *Subscription) push(es []Event) {
	var kept []Event // nil: all of es so far
	for i, e := range es {
		if s.admit(e) {
			if kept != nil {
				kept = append(kept, e)
			}
			continue
		}
		if s.isFinished() {
			return
		}
		if kept == nil {
			kept = append(make([]Event, 0, len(es)), es[:i]...)
		}
	}
	if kept == nil {
		kept = es
	}
	if len(kept) > 0 {
		s.pipe.PutAll(kept)
	}
}

// admit counts e in, or reports false: the subscription has finished, or
// e is a change event beyond maxChanges (dropped and counted), or e is one
// event too many for a reader that does not read (the subscription ends
// with ErrSlowReader).
func (s *Subscription) admit(e Event) bool {
	s.mu.Lock()
	if s.finished {
		s.mu.Unlock()
		return false
	}
	if e.Type == EventChange {
		if s.changes >= s.maxChanges {
			s.dropped++
			s.hub.dropped.Add(1)
			n := s.dropped
			s.mu.Unlock()
			if n == 1 || n%1000 == 0 {
				s.hub.log.Warn("leaderfeed: change events dropped for a slow reader", "dropped", n)
			}
			return false
		}
		s.changes++
	} else {
		if s.others >= maxPendingEvents {
			s.finished, s.err = true, ErrSlowReader
			s.mu.Unlock()
			s.cancel()
			return false
		}
		s.others++
	}
	s.mu.Unlock()
	return true
}

func (s *Subscription) isFinished() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.finished
}

// sent counts out an event the reader's channel took.
func (s *Subscription) sent(e Event) {
	s.mu.Lock()
	if e.Type == EventChange {
		s.changes--
	} else {
		s.others--
	}
	s.mu.Unlock()
}

// finish ends the subscription once its reader has taken what is queued
// (with linger, taking each within linger).
func (s *Subscription) finish() {
	s.mu.Lock()
	done := s.finished
	s.finished = true
	s.mu.Unlock()
	if !done {
		s.pipe.Finish(s.linger, s.dropRest)
	}
}

// dropRest counts the n events the reader left after the Feed finished.
func (s *Subscription) dropRest(n int) {
	s.mu.Lock()
	s.dropped += uint64(n)
	s.mu.Unlock()
	s.hub.log.Warn("leaderfeed: events dropped: the reader of Events took none after Stop", "dropped", n)
}

// Dropped returns how many events this subscription dropped: change events
// beyond Options.MaxPendingChanges waiting for its reader, and, for the
// subscription of Feed.Events, the events its reader left untaken too long
// after Stop (see Events).
func (s *Subscription) Dropped() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dropped
}

// Err returns ErrSlowReader if the subscription was ended because its
// reader fell too far behind, else nil.
func (s *Subscription) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Close ends the subscription: C is closed soon after, without delivering
// what is still queued. It is idempotent.
func (s *Subscription) Close() { s.cancel() }
