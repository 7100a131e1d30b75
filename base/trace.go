package base

import "time"

// Trace is a set of hooks that a Feed calls as its store calls return and
// as it emits events, for metrics and tracing, in the style of
// net/http/httptrace.ClientTrace: set Options.Trace, and leave the fields
// you do not need nil. Events say what happened; Trace adds what they do
// not carry, such as latencies and lost claims.
//
// The hooks are called by the Feed's engine, one at a time, in the order
// the calls returned (an idle engine takes a request of Resign, TransferTo
// or Proclaim on the caller's goroutine when its Elections has a goroutine
// to spare, and calls the hooks there). They must not block and must not call the
// Feed's methods that wait for the engine (Resign, Proclaim, Stop) or
// close its Elections: the election waits while a hook runs. Record a number and return.
//
// Every call names its election and node, so one Trace may serve every
// Feed of a process (all the Feeds of an Elections, say); its hooks are
// then called from many goroutines at once and must be safe for that.
type Trace struct {
	// ClaimDone is called when the reply to a claim of leadership came
	// back (or the call failed).
	ClaimDone func(ClaimInfo)
	// RenewDone is called when the reply to a renewal came back (or the
	// call failed).
	RenewDone func(RenewInfo)
	// Event is called with every event the Feed emits (the last ones of
	// Stop too), before any subscription is handed it: a metrics package
	// counts leadership changes here without a subscription, and its
	// goroutine, per Feed.
	Event func(EventInfo)
}

// EventInfo is one event of a Feed, as Trace.Event sees it.
type EventInfo struct {
	// Election and NodeID name the Feed.
	Election, NodeID string
	// Event is the event, as subscriptions get it.
	Event Event
}

// ClaimInfo is the outcome of one claim.
type ClaimInfo struct {
	// Election and NodeID name the Feed that claimed.
	Election, NodeID string
	// Term is the term claimed.
	Term uint64
	// Latency is the time from sending the claim to taking in its reply.
	Latency time.Duration
	// Won reports whether this node leads on the claim now.
	Won bool
	// Err is the store's error: a *ConflictError (matching ErrConflict)
	// when another node's write came first, another error when the call
	// failed; nil when the store took the claim (Won is still false if
	// the reply came after the lease the claim would have granted).
	Err error
}

// RenewInfo is the outcome of one renewal.
type RenewInfo struct {
	// Election and NodeID name the Feed that renewed.
	Election, NodeID string
	// Term is the term renewed.
	Term uint64
	// Latency is the time from sending the renewal to taking in its reply.
	Latency time.Duration
	// Err is the store's error: a *ConflictError when another node took
	// over, another error when the call failed; nil when the store took
	// the renewal.
	Err error
}
