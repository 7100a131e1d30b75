package base

import (
	"errors"
	"fmt"
	"time"

	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// Health is what a Feed knows of its own contact with the store, on this
// process's monotonic clock. A zero time means "never" or "not now", as each
// field says. Feed.Health returns it; Feed.Healthy judges it.
type Health struct {
	// Started is when the engine started (after Start's checks of the
	// store); zero before.
	Started time.Time
	// LastContact is when the store last answered: a read, a write (also a
	// refused compare-and-set), a notification or an opened changefeed.
	LastContact time.Time
	// LastRecord is when the newest revision of the election record was
	// first seen (also this node's own renewals): the age of the last
	// heartbeat seen, on this node's clock. Zero before the first record.
	LastRecord time.Time
	// FeedDownSince is when the changefeed went down (or the engine
	// started, until it first opens); zero while it is open.
	FeedDownSince time.Time
	// ReadsFailingSince is when reads of the record started failing; zero
	// after a read succeeded.
	ReadsFailingSince time.Time
	// RenewalsFailingSince is when the renewals of this node's current
	// term started failing; zero after one succeeded, and when it won.
	RenewalsFailingSince time.Time
	// Refused is the store's last refusal (an error matching ErrRefused)
	// while it refuses some kind of call (reads, writes, the changefeed);
	// nil once every refused kind succeeded again. RefusedSince is when
	// this run of refusals began.
	Refused      error
	RefusedSince time.Time
	// DuplicateSeen is when this Feed last saw a record written by another
	// process with its node id (ErrDuplicateID); zero if never.
	DuplicateSeen time.Time
	// ObserveOnly says what silence means: an ObserveOnly feed whose
	// changefeed is open may hear nothing for as long as the election is
	// vacant.
	ObserveOnly bool
}

// defaultHealthBound returns the bound Healthy uses when given none: twice
// ElectionTimeoutMax of t. In that time a healthy node hears from the
// store many times over (a leader renews, a follower is notified of each
// renewal or claims), and a failing changefeed is reopened or polled.
func defaultHealthBound(t heartbeat.Timing) time.Duration {
	return 2 * t.WithDefaults().ElectionTimeoutMax
}

// Health returns the Feed's view of its contact with the store.
func (f *Feed) Health() Health {
	f.mu.Lock()
	defer f.mu.Unlock()
	h := f.health
	h.ObserveOnly = f.opts.ObserveOnly
	return h
}

// Healthy reports whether the Feed works, in the style of a liveness
// check: nil if it does, else an error saying what is wrong, matching
// ErrUnhealthy when the Feed is wedged, ErrNotStarted before Start and
// ErrClosed after Stop. A Feed whose store refuses a kind of call is
// unhealthy at once, with an error matching ErrUnhealthy and ErrRefused
// ("store refuses: ..."): waiting cannot fix it. A Feed that saw another
// process write with its node id within bound is unhealthy too, with an
// error matching ErrUnhealthy and ErrDuplicateID. A Feed is wedged when,
// for longer than bound:
//
//   - it leads and its renewals have been failing (it steps down at the
//     end of its lease, so this shows only with a bound shorter than
//     LeaseDuration);
//   - its changefeed has been down and its reads of the record have been
//     failing: it cannot learn of a new leader;
//   - the store has not answered it at all (no read, write or
//     notification). An ObserveOnly feed whose changefeed is open counts
//     as in contact: a vacant election sends it nothing.
//
// A bound of zero or less means 2*ElectionTimeoutMax. A node that is not
// leader, or that lost leadership, is not unhealthy for that: the others
// lead. Healthy is safe for concurrent use and never blocks on the store.
// Package health serves it over HTTP, for a liveness probe.
func (f *Feed) Healthy(bound time.Duration) error {
	if bound <= 0 {
		bound = defaultHealthBound(f.opts.Timing)
	}
	f.mu.Lock()
	state, h, leader, term := f.state, f.health, f.snap.leader, f.snap.term
	f.mu.Unlock()
	switch state {
	case stateNew, stateStarting:
		return ErrNotStarted
	case stateStopped:
		return ErrClosed
	}
	now := time.Now()
	since := func(t time.Time) time.Duration { return now.Sub(t).Round(time.Millisecond) }
	if h.Refused != nil {
		return fmt.Errorf("%w: store refuses (for %v): %w", ErrUnhealthy, since(h.RefusedSince), h.Refused)
	}
	if !h.DuplicateSeen.IsZero() && now.Sub(h.DuplicateSeen) <= bound {
		return fmt.Errorf("%w: node id %q is used by another process (last seen %v ago): %w", ErrUnhealthy, f.id, since(h.DuplicateSeen), ErrDuplicateID)
	}
	if leader && !h.RenewalsFailingSince.IsZero() && now.Sub(h.RenewalsFailingSince) > bound {
		return fmt.Errorf("%w: renewals of term %d failing for %v", ErrUnhealthy, term, since(h.RenewalsFailingSince))
	}
	if !h.FeedDownSince.IsZero() && !h.ReadsFailingSince.IsZero() &&
		now.Sub(h.FeedDownSince) > bound && now.Sub(h.ReadsFailingSince) > bound {
		return fmt.Errorf("%w: changefeed down for %v and reads failing for %v", ErrUnhealthy, since(h.FeedDownSince), since(h.ReadsFailingSince))
	}
	silentOK := f.opts.ObserveOnly && h.FeedDownSince.IsZero()
	if !silentOK && now.Sub(h.LastContact) > bound {
		return fmt.Errorf("%w: no answer from the store for %v", ErrUnhealthy, since(h.LastContact))
	}
	return nil
}

// DroppedChanges returns how many change events were dropped for readers
// that fell more than Options.MaxPendingChanges behind, every
// subscription of the Feed together (Subscription.Dropped counts one).
func (f *Feed) DroppedChanges() uint64 { return f.events.dropped.Load() }

// ---- the machine's side (health and Trace) ----

// publishHealth hands the getters the machine's Health as it is after the
// step. The machine adds it to a step that changed its Health, last but
// for a question. It carries nothing, so it costs no allocation.
type publishHealth struct{}

// traceCall calls Trace.ClaimDone or Trace.RenewDone for a claim or renewal
// that came back; the machine sends it only when a Trace asks for one.
type traceCall struct {
	kind    callKind
	term    uint64
	latency time.Duration
	won     bool
	err     error
}

func (publishHealth) isEffect() {}
func (*traceCall) isEffect()    {}

func (m *machine) contact() {
	m.health.LastContact = m.now
	m.healthChanged = true
}

// noteFeed takes in whether the changefeed is up (opened, or notified)
// or down.
func (m *machine) noteFeed(up bool) {
	switch {
	case up:
		m.contact()
		m.health.FeedDownSince = time.Time{}
	case m.health.FeedDownSince.IsZero():
		m.health.FeedDownSince = m.now
		m.healthChanged = true
	}
}

// answered reports whether the store answered the call: it took it, or
// told why not in the contract's terms (a conflict, no record, a
// malformed record, a guarded write's missing guard). A refusal
// (ErrRefused) is an answer too, but not one that the call worked: it
// counts as contact, not as success.
func (r *callResult) answered() bool {
	if r.err == nil {
		return true
	}
	var conflict *backend.ConflictError
	return errors.As(r.err, &conflict) || errors.Is(r.err, backend.ErrNotFound) || errors.Is(r.err, backend.ErrMalformedRecord) ||
		errors.Is(r.err, backend.ErrNotPresent)
}

// noteResult takes in the result of a store call once the machine has
// stepped it.
func (m *machine) noteResult(r *callResult) {
	answered := r.answered()
	failed := !answered && !r.closed
	leading := m.role == roleLeader && m.term == r.next.Term
	h := &m.health
	if answered || errors.Is(r.err, ErrRefused) {
		m.contact() // the store answers, if only to refuse
	}
	switch r.kind {
	case callRead:
		if answered {
			h.ReadsFailingSince = time.Time{}
		} else if failed && h.ReadsFailingSince.IsZero() {
			h.ReadsFailingSince = m.now
		}
	case callClaim:
		if leading {
			h.RenewalsFailingSince = time.Time{}
		}
	case callRenew:
		if r.err == nil {
			h.RenewalsFailingSince = time.Time{}
		} else if failed && leading && h.RenewalsFailingSince.IsZero() {
			h.RenewalsFailingSince = m.now
		}
	}
	m.healthChanged = true
	if m.traced && !r.closed && (r.kind == callClaim || r.kind == callRenew) {
		m.do(m.arena().traces.add(traceCall{kind: r.kind, term: r.next.Term, latency: m.now.Sub(r.sentAt), won: leading, err: r.err}))
	}
}

// traceCall executes a traceCall.
func (l *loop) traceCall(eff effect) {
	c := eff.(*traceCall)
	tr := l.f.opts.Trace
	switch {
	case c.kind == callClaim && tr.ClaimDone != nil:
		tr.ClaimDone(ClaimInfo{Election: l.f.Election(), NodeID: l.f.id, Term: c.term, Latency: c.latency, Won: c.won, Err: c.err})
	case c.kind == callRenew && tr.RenewDone != nil:
		tr.RenewDone(RenewInfo{Election: l.f.Election(), NodeID: l.f.id, Term: c.term, Latency: c.latency, Err: c.err})
	}
}
