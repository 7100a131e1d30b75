package base

import (
	"context"
	"fmt"
	"sync"
	"time"
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
	// Reason: why leadership ended (EventUnelected).
	Reason Reason
	// Change: the change to another record (EventChange).
	Change Change
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

// dispatcher delivers events on one goroutine, in order, without ever
// blocking the producer. Leadership events are never dropped; change events
// beyond maxChanges waiting are dropped and counted.
type dispatcher struct {
	out        chan Event
	wake       chan struct{}
	finish     chan struct{} // closed by Stop: deliver what is queued, then end
	abort      chan struct{} // closed by Stop when its context ends: end now
	maxChanges int

	mu       sync.Mutex
	enabled  bool // Events was called
	queue    []Event
	changes  int // change events in queue
	dropped  uint64
	onDrop   func(total uint64)
	finished bool
}

func newDispatcher(maxChanges int, onDrop func(uint64)) *dispatcher {
	return &dispatcher{
		out:        make(chan Event),
		wake:       make(chan struct{}, 1),
		finish:     make(chan struct{}),
		abort:      make(chan struct{}),
		maxChanges: maxChanges,
		onDrop:     onDrop,
	}
}

func (d *dispatcher) enable() <-chan Event {
	d.mu.Lock()
	d.enabled = true
	d.mu.Unlock()
	return d.out
}

func (d *dispatcher) push(e Event) {
	d.mu.Lock()
	if !d.enabled || d.finished {
		d.mu.Unlock()
		return
	}
	if e.Type == EventChange {
		if d.changes >= d.maxChanges {
			d.dropped++
			n := d.dropped
			d.mu.Unlock()
			if d.onDrop != nil {
				d.onDrop(n)
			}
			return
		}
		d.changes++
	}
	d.queue = append(d.queue, e)
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

func (d *dispatcher) droppedCount() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.dropped
}

// run delivers until finish is closed and the queue is empty, or abort is
// closed; then it closes out.
func (d *dispatcher) run() {
	defer close(d.out)
	finishing := false
	for {
		d.mu.Lock()
		var e Event
		has := len(d.queue) > 0
		if has {
			e = d.queue[0]
			d.queue[0] = Event{}
			d.queue = d.queue[1:]
			if e.Type == EventChange {
				d.changes--
			}
		} else if finishing {
			d.finished = true
		}
		d.mu.Unlock()
		if !has {
			if finishing {
				return
			}
			select {
			case <-d.wake:
			case <-d.finish:
				finishing = true
			case <-d.abort:
				return
			}
			continue
		}
		select {
		case d.out <- e:
		case <-d.abort:
			return
		}
	}
}
