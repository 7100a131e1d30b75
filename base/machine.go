package base

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// role is what a node does in the election now.
type role int

const (
	roleObserver  role = iota + 1 // ObserveOnly: follows, never claims
	roleFollower                  // waits for the election timeout
	roleCandidate                 // a claim is in flight
	roleLeader                    // holds a lease
	roleStopping                  // Stop was called: finishing the last write
)

func (r role) String() string {
	return [...]string{"?", "observer", "follower", "candidate", "leader", "stopping"}[r]
}

// ---- inputs ----

// input is what the driver (loop) hands to machine.step: a store call's
// result, a timer that fired, a notification of the feed, a request of
// the API, Stop, or the answer to an effect that asked the driver a
// question (leaseExtended, vacancyAborted).
type input interface{ isInput() }

// startInput starts the engine.
type startInput struct{}

// stopInput: Stop was called; ctx is Stop's context, which bounds the
// vacancy write.
type stopInput struct{ ctx context.Context }

// exitInput: the engine ends now (Stop finished, or Stop's context ended).
type exitInput struct{}

// timerInput: the named timer fired.
type timerInput struct{ t timerID }

// leaseLostInput: the lease timer cancelled a leader context. expired says
// whether the current leader context is over (its Err, read by the driver):
// the signal may be of an earlier term or of a lease since extended.
type leaseLostInput struct{ expired bool }

// subscribedInput is the result of an openFeed effect. ok says Subscribe
// gave a channel (err is nil and the channel is not nil).
type subscribedInput struct {
	err error
	ok  bool
}

// notificationInput is one notification of the feed; ok false: the feed's
// channel was closed.
type notificationInput struct {
	n  backend.Notification
	ok bool
}

// requestInput is a call of Resign, Proclaim or the status probe.
type requestInput struct{ r request }

// leaseExtendedInput answers an extendLease effect: ok says the lease
// context took the new end (it had not ended nor been cancelled).
type leaseExtendedInput struct{ ok bool }

// vacancyAbortedInput answers a startCall of a vacancy whose context had
// ended already: the call was not started.
type vacancyAbortedInput struct{ err error }

type callKind int

const (
	callRead callKind = iota + 1
	callClaim
	callRenew
	callVacancy
)

// callResult is the outcome of one store call, an input of the machine.
// closed and parentDone are read by the driver when it hands the result
// over: whether the engine's context had ended (the Feed is going away),
// and, for a vacancy, whether the vacancy's own context (Resign's or
// Stop's) had.
type callResult struct {
	kind       callKind
	expected   heartbeat.Record
	next       heartbeat.Record
	sentAt     time.Time
	sentStep   uint64 // the step that asked for the call (see current)
	res        heartbeat.Record
	err        error
	parent     context.Context // the vacancy's context; nil for other calls
	closed     bool
	parentDone bool
}

func (startInput) isInput()          {}
func (stopInput) isInput()           {}
func (exitInput) isInput()           {}
func (timerInput) isInput()          {}
func (leaseLostInput) isInput()      {}
func (subscribedInput) isInput()     {}
func (notificationInput) isInput()   {}
func (requestInput) isInput()        {}
func (leaseExtendedInput) isInput()  {}
func (vacancyAbortedInput) isInput() {}
func (callResult) isInput()          {}

// ---- effects ----

// effect is what the machine asks the driver to do, in order. Effects are
// plain data; the driver executes them one after the other as they come.
// Two of them ask the driver a question whose answer is fed back at once as
// the next input, before any other input: extendLease (leaseExtendedInput)
// and startCall of a vacancy whose context has ended (vacancyAbortedInput).
// Both are always the last effect of their step.
type effect interface{ isEffect() }

// timerID names one of the engine's timers.
type timerID int

const (
	timerClaim    timerID = iota + 1 // a follower's election timeout: timerInput
	timerRenew                       // the leader's next renewal: timerInput
	timerReopen                      // reopen the failed changefeed: timerInput
	timerPoll                        // read the record while the feed is down: timerInput
	timerPresence                    // refresh the presence record: timerInput
	timerLease                       // the lease's end: see armLease; stopTimer only
)

func (t timerID) String() string {
	return [...]string{"?", "claim", "renew", "reopen", "poll", "presence", "lease"}[t]
}

// startCall starts one store call off the engine's goroutine; its result
// comes back as a callResult carrying kind, expected, next and sentAt. A
// read is Backend.Get, the others Backend.Heartbeat(expected, next). The
// call's context ends at deadline (when set), and with the engine's; a
// vacancy's is derived from parent (Resign's or Stop's context; nil: the
// engine's) as well, and is not started if parent has ended
// (vacancyAbortedInput). A vacancy with guard.Node set is the guarded
// write (backend.GuardElection).
type startCall struct {
	kind     callKind
	expected heartbeat.Record
	next     heartbeat.Record
	sentAt   time.Time
	sentStep uint64
	deadline time.Time
	parent   context.Context
	guard    backend.Guard
}

// emit queues an event for the subscriptions (and logs it). A zero At is
// stamped by the driver when it emits: with the instant it executed the
// last cancelLeader, if notAfter is set (never later than notAfter), else
// with the clock.
type emit struct {
	ev       Event
	notAfter time.Time
}

// setTimer (re)arms a timer to fire at an absolute instant (at once if it
// has passed). stopTimer stops it. align marks a renewal due at at that
// the driver may send less than a heartbeat interval earlier, so that the
// renewals of many elections share batches (loop.renewAt); renewing early
// is safe, as the lease runs from the renewal's own send time.
type setTimer struct {
	t     timerID
	at    time.Time
	align bool
}

type stopTimer struct{ t timerID }

// cancelLeader cancels a leader context with a cause. stepDown makes it
// the first effect of the end of a term.
type cancelLeader struct {
	ctx   *leaseContext
	cause error
}

// armLease (re)arms the lease timer: at end it cancels ctx with
// ErrLeaseExpired, on whatever goroutine, and then tells the engine
// (leaseLostInput). stopTimer{timerLease} stops it.
type armLease struct {
	ctx *leaseContext
	end time.Time
}

// extendLease moves the end of a leader context's lease to end, unless the
// lease has ended or the context was cancelled (leaseContext.extend); the
// driver answers with a leaseExtendedInput. The renewal's result waits in
// the machine meanwhile (extending), not in the effect: it is large.
type extendLease struct {
	ctx *leaseContext
	end time.Time
}

// publish hands the getters a new snapshot (and the lease's end).
type publish struct {
	snap     snapshot
	leaseEnd time.Time
}

// reply answers a waiting caller (Resign, Proclaim, status).
type reply struct {
	to  chan<- error
	err error
}

// logDebug logs a fixed message at Debug, logLine at its level.
type (
	logDebug struct {
		msg  string
		args []any
	}
	logLine struct {
		level slog.Level
		msg   string
		args  []any
	}
)

// openFeed opens the changefeed off the engine's goroutine; the result
// comes back as a subscribedInput. useFeed takes the channel it gave as the
// engine's feed, discardFeed cancels it, closeFeed cancels the feed in use
// (if any).
type (
	openFeed    struct{}
	useFeed     struct{}
	discardFeed struct{}
	closeFeed   struct{}
)

func (*startCall) isEffect()   {}
func (*emit) isEffect()        {}
func (*setTimer) isEffect()    {}
func (stopTimer) isEffect()    {}
func (cancelLeader) isEffect() {}
func (*armLease) isEffect()    {}
func (*extendLease) isEffect() {}
func (*publish) isEffect()     {}
func (reply) isEffect()        {}
func (logDebug) isEffect()     {}
func (logLine) isEffect()      {}
func (openFeed) isEffect()     {}
func (useFeed) isEffect()      {}
func (discardFeed) isEffect()  {}
func (closeFeed) isEffect()    {}

// ---- the machine ----

// machine is the election state of one Feed and its transitions: step
// takes the state and one input to a new state and the effects that input
// asks for. It does no I/O, starts no goroutine, touches no timer, channel
// or mutex, and reads the time only from step's now; the driver (loop)
// owns everything else. Its random draws come from Options.Rand.
//
// At most one write (claim, renewal or vacancy) is in flight at a time,
// and at most one read.
//
// The one object the machine makes that lives on its own is the leader
// context of a term (newLeaseContext, which does no I/O): cancelling it,
// arming the timer that cancels it at the lease's end and extending its
// lease are effects (cancelLeader, armLease, extendLease).
//
// Why there is never more than one leader is told in one place, next to
// the claim logic it rests on: see claimDue.
type machine struct {
	id       string
	inc      uint64 // this process's incarnation (heartbeat.Record.Incarnation)
	election string
	t        heartbeat.Timing
	rand     heartbeat.Rand
	role     role

	// What this node knows of the record.
	rec        heartbeat.Record // newest record observed; Revision 0: none
	seen       bool             // rec was read or notified at least once
	missing    bool             // the store has no record (never had, or deleted)
	deleted    bool             // ... because it was deleted after we saw it
	observedAt time.Time        // when rec.Revision was first observed
	observedIn uint64           // ... in which step (see current)
	recLease   time.Duration    // the Lease of rec, kept when the record is deleted
	maxTerm    uint64           // the highest term ever observed
	announced  struct {
		leader string
		term   uint64
		value  []byte
		ok     bool
	}
	claimTerm    uint64    // the term of this node's last claim; a record naming it with it is its own
	claimToken   uint64    // the handover token of claimTerm when it was handed over (0: claimed)
	claimedTerms [3]uint64 // the terms of this node's claims before claimTerm, newest first (0: none)
	vacancyTerm  uint64    // a vacant record with this term was written by this node (0: none)
	handedOver   bool      // Resign or Stop gave up the last term: its record is not claimed at once
	noGuard      bool      // the backend has no guarded write: a handover reads the participants first
	claimSoon    bool      // claim the own record at once (a late claim)
	claimSentAt  time.Time // when this node's last claim was sent
	value        []byte

	// Leadership: set while leading.
	term      uint64
	myRev     uint64 // newest revision this node wrote in its term
	leaseEnd  time.Time
	leaderCtx *leaseContext
	lastErr   error

	writing    bool          // a claim, renewal or vacancy is in flight
	reading    bool          // a read is in flight
	readAgain  bool          // a read was asked for while one was in flight
	readFailed bool          // the last read failed: poll until one succeeds
	vacancy    *vacancyWrite // the vacancy to write (pending or in flight)
	proclaims  []proclaim    // Proclaim calls waiting for a renewal to carry their value
	carried    []proclaim    // ... and those the renewal in flight carries
	renewNow   bool          // renew as soon as the write in flight returns
	extending  extending     // the renewal whose extendLease awaits its answer
	stopCtx    context.Context

	pres     *priorityCheck // presence and the Priority check; nil: not participating
	dups     *[4]dupWrite   // the other incarnations of this node id whose writes dupSeen saw, newest first; nil: none yet
	startRev uint64         // the lowest revision known to be committed since this process started (sinceStart)
	together bool           // other elections of the process hear of a silent leader (leaderSilent)
	leaving  bool           // Stop's delete of the presence record is in flight (onLeft)
	lastRead bool           // Stop's last read of the record is in flight (onLeft)

	// The changefeed.
	feedUp    bool      // the feed is open
	opening   bool      // Subscribe is in flight
	subOpened time.Time // when the feed opened
	backoff   time.Duration

	// What the getters were last given.
	snap        snapshot
	snapLeaseTo time.Time

	// Health (health.go) and the account of refusals (refused.go).
	health        Health
	healthChanged bool      // since the last publishHealth
	refusals      *refusals // nil: the store has refused no call yet
	traced        bool      // a Trace wants ClaimDone or RenewDone

	now   time.Time     // of the step under way
	steps uint64        // the number of the step under way: steps are totally ordered, their clock readings may be equal
	out   []effect      // effects of the step under way
	quiet bool          // set by the driver: Debug is not logged, so no logDebug
	effs  *effectArenas // from arenas, until recycle
}

// effectArenas hold the values of a step's frequent effects, which the
// machine hands out by pointer: a pointer in an effect costs no
// allocation, where a struct larger than a word is copied to the heap,
// several times for every renewal. recycle empties them and hands them
// back to the pool (so 10,000 idle machines keep none), and the driver
// must not keep an effect once it executed it.
type effectArenas struct {
	// out is room for a step's slice of effects (machine.out), handed
	// to the step that takes these arenas and back by recycle, so that an
	// idle machine keeps none either.
	out     []effect
	calls   arena[startCall]
	emits   arena[emit]
	timers  arena[setTimer]
	leases  arena[armLease]
	extends arena[extendLease]
	pubs    arena[publish]
	traces  arena[traceCall]
}

var arenas = sync.Pool{New: func() any { return new(effectArenas) }}

// arena returns the arenas of the step under way, taken from the pool
// when the step adds its first effect.
func (m *machine) arena() *effectArenas {
	if m.effs == nil {
		m.effs = arenas.Get().(*effectArenas)
	}
	return m.effs
}

func (a *effectArenas) reset() {
	a.calls.reset()
	a.emits.reset()
	a.timers.reset()
	a.leases.reset()
	a.extends.reset()
	a.pubs.reset()
	a.traces.reset()
}

// arena holds the effects of one type of a step (see effectArenas).
type arena[T any] []T

// add stores v and returns where. A later add that grows the arena leaves
// the earlier values where they were (in the old array).
func (a *arena[T]) add(v T) *T {
	*a = append(*a, v)
	return &(*a)[len(*a)-1]
}

func (a *arena[T]) reset() {
	clear(*a)
	*a = (*a)[:0]
}

// proclaim is a Proclaim call waiting for a renewal. Its value becomes
// the node's value (m.value, which later terms publish) only once a renewal
// carrying it succeeded, and only if its caller has not given up first
// (settle): a Proclaim that fails has no later effect.
type proclaim struct {
	ctx    context.Context // nil in machine tests: never ends
	reply  chan<- error
	value  []byte
	settle *settle // nil in machine tests: the caller never gives up
}

// settle decides, once, between a caller that gives up waiting (its
// context ended) and the engine that takes its request: whichever comes
// first wins, and the other side abides by it. Proclaim needs it so that
// a value is the node's from then on exactly when Proclaim returns nil.
type settle struct{ state atomic.Int32 }

// take is the engine's side: true if the caller had not given up.
func (s *settle) take() bool { return s == nil || s.state.CompareAndSwap(0, 1) }

// giveUp is the caller's side: true if the engine had not taken it.
func (s *settle) giveUp() bool { return s == nil || s.state.CompareAndSwap(0, 2) }

// extending is what onLeaseExtended needs of a renewal whose extendLease
// awaits its answer.
type extending struct {
	res      heartbeat.Record
	sentAt   time.Time
	sentStep uint64
}

// vacancyWrite is the write that ends a term after stepping down, for
// Resign or a transfer (reply set) or Stop: a vacancy, or a handover in
// one write (to).
type vacancyWrite struct {
	ctx       context.Context // nil: the engine's, each attempt bounded by timeout
	timeout   time.Duration
	reply     chan<- error
	term      uint64
	successor string // the node the vacancy is reserved for (a transfer, or a successor whose presence is too old for to)
	transfer  bool   // TransferTo or the Priority check: the write must reach successor
	// to, when set, is the participant the election is handed to in one
	// write: the record names it leader with a new term and the token of
	// its presence (heartbeat.Record.Handover), instead of a vacancy.
	to backend.Presence
	// guard, when its Node is set, is the participant the write names
	// (to, or the successor of a reserved vacancy) as the leader read it:
	// the write is made only while its presence record is in the store
	// (backend.GuardStore), so that it never names a node that withdrew.
	guard    backend.Guard
	left     string // the transfer's target withdrew before the write (ErrNotPresent)
	attempts int
	inFlight bool
	viewing  bool // the participants are being read for it (handOver)
}

func newMachine(id, election string, t heartbeat.Timing, opts Options) *machine {
	r := roleFollower
	if opts.ObserveOnly {
		r = roleObserver
	}
	traced := opts.Trace != nil && (opts.Trace.ClaimDone != nil || opts.Trace.RenewDone != nil)
	m := &machine{id: id, election: election, t: t, rand: opts.Rand, role: r, value: opts.Value, pres: newPriorityCheck(opts), traced: traced}
	m.inc = drawIdentity()
	return m
}

// drawIdentity draws an incarnation or a presence token: a number in [1,
// heartbeat.MaxToken] that only this process may write, from math/rand/v2's
// global source (seeded by the runtime from the system's entropy), never
// from Options.Rand: a seeded Rand shared by two processes with one node id
// would give both the same identity, and safety would rest on the ids.
func drawIdentity() uint64 { return uint64(1 + rand.Int64N(heartbeat.MaxToken)) }

// step is the transition of the machine on input in at instant now: it
// updates the state and returns the effects, in the order the driver must
// execute them.
func (m *machine) step(now time.Time, in input) []effect {
	m.now = now
	m.steps++
	switch in := in.(type) {
	case startInput:
		m.health = Health{Started: now, LastContact: now, FeedDownSince: now}
		m.healthChanged = true
		m.openFeed()
		m.startRead()
		m.setTimer(timerPoll, now.Add(m.t.HeartbeatInterval)) // until the feed is up
		if p := m.pres; p != nil {
			// Start wrote the presence record with a token: the first
			// refresh is due an interval after that write was sent, not
			// after this step, so that a process stalled between the two
			// still offers a token at most about an interval old (a leader
			// handing over reads an older one as too old for one write).
			at := now.Add(p.interval)
			if s := p.sent[(p.next+presenceTokens-1)%presenceTokens]; !s.sentAt.IsZero() && s.sentAt.Before(now) {
				at = s.sentAt.Add(p.interval)
			}
			m.setTimer(timerPresence, at)
		}
	case stopInput:
		m.onStop(in.ctx)
	case exitInput:
		m.exit()
	case timerInput:
		m.onTimer(in.t)
	case leaseLostInput:
		m.onLeaseLost(in.expired)
	case subscribedInput:
		m.noteFeed(in.err == nil)
		m.noteRefusal(refusedFeed, in.err, in.err == nil)
		m.onSubscribed(in)
	case notificationInput:
		m.noteFeed(in.ok && in.n.Type != backend.Failed)
		if in.ok && in.n.Type == backend.Failed {
			m.noteRefusal(refusedFeed, in.n.Err, false)
		}
		m.onNotification(in.n, in.ok)
	case requestInput:
		m.onRequest(in.r)
	case callResult:
		m.stepResult(&in)
	case *callResult: // the driver's, which boxes no copy
		m.stepResult(in)
	case presenceResult:
		m.onPresence(in)
	case handoverViewResult:
		m.onHandoverView(in)
	case silentInput:
		m.onSilent(in)
	case leftInput:
		m.onLeft()
	case leaseExtendedInput:
		x := m.extending
		m.extending = extending{}
		m.onLeaseExtended(x.res, x.sentAt, m.current(x.sentStep), in.ok)
		m.afterWrite()
	case vacancyAbortedInput:
		m.writing = false
		m.vacancy.inFlight = false
		m.vacancy.attempts--
		m.endVacancy(fmt.Errorf("leaderfeed: vacant record not written: %w", in.err))
	}
	if m.refusals != nil && m.refusals.ops != 0 {
		m.expireRefusals()
	}
	if m.healthChanged {
		m.healthChanged = false
		m.do(publishHealth{})
		if n := len(m.out); n > 1 && asks(m.out[n-2]) {
			m.out[n-2], m.out[n-1] = m.out[n-1], m.out[n-2] // the question stays last
		}
	}
	out := m.out
	m.out = nil
	return out
}

// asks reports whether the driver may answer effect e with an input (see
// effect).
func asks(e effect) bool {
	switch e := e.(type) {
	case *extendLease:
		return true
	case *startCall:
		return e.kind == callVacancy
	}
	return false
}

// stepResult takes in the result of a store call.
func (m *machine) stepResult(r *callResult) {
	if !r.closed {
		m.noteRefusal(opOf(r.kind), r.err, r.answered())
	}
	if r.err == nil && r.kind != callRead {
		m.sinceStart(r.res.Revision) // this process's own write
	}
	m.onResult(*r)
	m.noteResult(r)
}

// done reports whether the engine may end: Stop was called and the last
// write is over.
func (m *machine) done() bool {
	return m.role == roleStopping && !m.writing && m.vacancy == nil && !m.leaving && !m.lastRead
}

// do adds e to the step's effects, in a slice from the arenas (see
// effectArenas.out) for the first.
func (m *machine) do(e effect) {
	if m.out == nil {
		a := m.arena()
		m.out, a.out = a.out, nil
	}
	m.out = append(m.out, e)
}

// recycle takes back the effects of a step once the driver has executed
// them all: their slice goes back to the pool with the arenas, for the
// next step that takes them.
func (m *machine) recycle(effects []effect) {
	clear(effects)
	if m.effs != nil {
		m.effs.out = effects[:0]
		m.effs.reset()
		arenas.Put(m.effs)
		m.effs = nil
	}
}

// setTimer arms timer t for at, or later while the store refuses the kind
// of call it starts (refusalDelay).
func (m *machine) setTimer(t timerID, at time.Time) {
	m.do(m.arena().timers.add(setTimer{t: t, at: m.refusalDelay(t, at)}))
}

func (m *machine) stopTimer(t timerID) { m.do(stopTimer{t: t}) }

func (m *machine) emit(e Event) { m.do(m.arena().emits.add(emit{ev: e})) }

func (m *machine) publish() { m.do(m.arena().pubs.add(publish{snap: m.snap, leaseEnd: m.snapLeaseTo})) }

// debug logs msg at Debug, unless the driver said Debug is not logged.
func (m *machine) debug(msg string, args ...any) {
	if !m.quiet {
		m.do(logDebug{msg: msg, args: args})
	}
}

func (m *machine) call(kind callKind, expected, next heartbeat.Record, deadline time.Time, parent context.Context) {
	m.do(m.arena().calls.add(startCall{kind: kind, expected: expected, next: next, sentAt: m.now, sentStep: m.steps, deadline: deadline, parent: parent}))
}

// exit ends the engine: the leader context is cancelled (Stop's context
// ended before the clean path finished), a waiting Resign is answered, the
// timers and the feed are stopped.
func (m *machine) exit() {
	if m.role == roleLeader {
		m.stepDown(ReasonStopped, nil)
	}
	if m.vacancy != nil && m.vacancy.reply != nil {
		m.do(reply{to: m.vacancy.reply, err: ErrClosed})
	}
	for _, t := range []timerID{timerClaim, timerRenew, timerReopen, timerPoll} {
		m.stopTimer(t)
	}
	if m.pres != nil {
		m.stopTimer(timerPresence)
	}
	m.do(closeFeed{})
}

func (m *machine) onTimer(t timerID) {
	switch t {
	case timerClaim:
		m.onClaimTimer()
	case timerRenew:
		m.startRenew()
	case timerReopen:
		m.openFeed()
	case timerPresence:
		m.onPresenceTimer()
	case timerPoll:
		if !m.feedUp || (m.readFailed && (m.role == roleFollower || m.role == roleObserver)) {
			m.startRead()
			m.setTimer(timerPoll, m.now.Add(m.t.HeartbeatInterval))
		}
	}
}

func (m *machine) onResult(r callResult) {
	switch r.kind {
	case callRead:
		m.reading = false
		m.onRead(r)
		if m.readAgain {
			m.readAgain = false
			m.startRead()
		}
		return
	case callClaim:
		m.writing = false
		m.onClaim(r)
	case callRenew:
		m.writing = false
		if m.onRenew(r) {
			return // afterWrite once the lease's extension is known
		}
	case callVacancy:
		m.writing = false
		m.onVacancy(r)
	}
	m.afterWrite()
}

// afterWrite starts what waited for the write that just returned.
func (m *machine) afterWrite() {
	if m.writing {
		return
	}
	switch {
	case m.vacancy != nil:
		m.startVacancy()
	case m.role == roleLeader && m.renewNow:
		// A renewal asked for while the write was in flight (Proclaim,
		// or a renewal whose reply was lost). Proclaims waiting after a
		// failed renewal wait for its retry (timerRenew): renewing again
		// at once would spin as fast as the store fails.
		m.renewNow = false
		m.startRenew()
	case m.role == roleFollower:
		m.armClaim(false)
	}
}

// ---- the changefeed ----

// openFeed opens the changefeed. While it is down (also before it first
// opens) the record is polled.
func (m *machine) openFeed() {
	if m.opening || m.feedUp {
		return
	}
	m.opening = true
	m.do(openFeed{})
}

func (m *machine) onSubscribed(r subscribedInput) {
	m.opening = false
	if r.err != nil {
		m.feedDown(fmt.Errorf("leaderfeed: subscribe: %w", r.err))
		return
	}
	if m.role == roleStopping {
		m.do(discardFeed{})
		return
	}
	m.feedUp, m.subOpened = r.ok, m.now
	m.do(useFeed{})
	m.stopTimer(timerPoll)
	m.emit(Event{Type: EventSubscribeStarted})
	// Changes committed while the feed was down are not in it: read.
	m.startRead()
}

// feedDown records a failure of the feed, schedules its reopening with
// backoff and starts polling.
func (m *machine) feedDown(err error) {
	m.do(closeFeed{})
	m.feedUp = false
	base := max(time.Millisecond, m.t.HeartbeatInterval/20)
	if m.backoff == 0 || (!m.subOpened.IsZero() && m.now.Sub(m.subOpened) > m.t.ElectionTimeoutMin) {
		m.backoff = base
	} else {
		m.backoff = min(2*m.backoff, m.t.ElectionTimeoutMax)
	}
	m.subOpened = time.Time{}
	m.emit(Event{Type: EventSubscribeError, Err: err})
	m.setTimer(timerReopen, m.now.Add(m.backoff+m.jitter(m.backoff/2)))
	m.setTimer(timerPoll, m.now.Add(m.t.HeartbeatInterval))
}

func (m *machine) onNotification(n backend.Notification, ok bool) {
	if !ok {
		m.feedDown(errors.New("leaderfeed: changefeed closed without an error"))
		return
	}
	switch n.Type {
	case backend.RecordChanged:
		m.sinceStart(n.Record.Revision)
		m.observe(n.Record, false)
	case backend.RecordDeleted:
		m.observeMissing()
	case backend.OtherChanged:
		m.emit(Event{Type: EventChange, Change: n.Change})
	case backend.Ignored:
		m.emit(Event{Type: EventIgnored, Err: n.Err})
	case backend.Failed:
		err := n.Err
		if err == nil {
			err = errors.New("leaderfeed: changefeed failed")
		}
		m.feedDown(err)
	default:
		m.emit(Event{Type: EventError, Err: fmt.Errorf("leaderfeed: backend sent a notification of unknown type %v", n.Type)})
	}
}

// ---- observing the record ----

// startRead reads the record. Leaders skip it: their renewals find out
// everything a read would.
func (m *machine) startRead() {
	if m.role == roleLeader || m.role == roleStopping {
		return
	}
	if m.reading {
		// The read in flight may have been answered before what this
		// read is for (a feed just opened): read once more after it.
		m.readAgain = true
		return
	}
	m.reading = true
	m.call(callRead, heartbeat.Record{}, heartbeat.Record{}, m.now.Add(m.t.ElectionTimeoutMin), nil)
}

func (m *machine) onRead(r callResult) {
	// A failed read is retried every heartbeat interval, also while the
	// feed is up: the feed reports changes, not the record as it is, so a
	// node whose read failed would otherwise wait for the next change,
	// forever in an election nobody writes (vacant, or its leader gone).
	m.readFailed = r.err != nil && !errors.Is(r.err, backend.ErrNotFound) && !errors.Is(r.err, backend.ErrMalformedRecord) && !r.closed
	if m.role == roleStopping && m.lastRead {
		m.lastRead = false
		if r.err == nil {
			m.observe(r.res, m.current(r.sentStep))
			m.passOn() // also of a record the feed brought while leaving
		}
		return
	}
	if m.role != roleFollower && m.role != roleObserver {
		return // a leader's or candidate's writes know better
	}
	if m.readFailed {
		m.setTimer(timerPoll, m.now.Add(m.t.HeartbeatInterval))
	}
	fresh := m.current(r.sentStep)
	switch err := r.err; {
	case err == nil:
		m.observe(r.res, fresh)
	case errors.Is(err, backend.ErrNotFound):
		if fresh {
			m.observeMissing()
		}
	case errors.Is(err, backend.ErrMalformedRecord):
		m.emit(Event{Type: EventIgnored, Err: err})
		m.armClaim(false)
	case r.closed:
	default:
		m.emit(Event{Type: EventError, Err: fmt.Errorf("leaderfeed: read record: %w", err)})
		m.armClaim(false)
	}
}

// own reports whether r is a record of this node's last term in this
// process: it names this node with the term of its last claim, and is its
// own write (no handover token, this process's incarnation) or the
// handover it took (claimToken).
func (m *machine) own(r heartbeat.Record) bool {
	return r.Revision != 0 && m.claimTerm != 0 && r.Leader == m.id && r.Term == m.claimTerm &&
		((r.Handover == 0 && m.mine(r)) || (r.Handover != 0 && r.Handover == m.claimToken))
}

// mine reports whether a record naming this node, written by a claim or a
// renewal, may be this process's write: it carries this process's
// incarnation, or none (a store or writer of a version before
// Record.Incarnation, where the node id alone must tell, as it did then).
// A record of another incarnation was written by another process that
// uses this node id: never this process's own (see dupSeen).
func (m *machine) mine(r heartbeat.Record) bool {
	return r.Incarnation == m.inc || r.Incarnation == 0
}

// dupWrite is another incarnation of this node id and the two newest
// revisions of its claims and renewals seen (0: none).
type dupWrite struct{ inc, top, next uint64 }

// sinceStart takes in a revision the store committed after this process
// started: one of its own writes, or one its changefeed brought (a feed
// reports commits made after it opened). Every revision above it was
// committed later still (revisions only grow), so after the start too.
func (m *machine) sinceStart(rev uint64) {
	if rev == 0 || (m.startRev != 0 && rev >= m.startRev) {
		return
	}
	m.startRev = rev
	if m.dups == nil {
		return
	}
	for i := range m.dups {
		if m.dups[i].inc != 0 {
			m.dupCheck(i)
		}
	}
}

// dupSeen takes in a claim or renewal naming this node with another
// process's incarnation, from a read, a reply or the feed, whatever the
// view keeps of it. Another process that used this node id before this
// one started commits at most one write after this start: each of its
// writes is a compare-and-set on a revision it knew, so of two of its
// writes both committed since, the later one expected a revision made
// since, and was sent after this process started. Two writes of one
// incarnation at or above startRev are therefore a twin: another process
// running with this node id now. A predecessor's last write committed
// late, its writes found by a stale read, or after the feed lagged, are
// not. Harmless to safety (neither takes the other's writes for its own,
// see own), but the operator must hear of it: logged at Error once, an
// EventError, and Health until it has not been seen for a while.
func (m *machine) dupSeen(r heartbeat.Record) {
	if m.dups == nil {
		// Allocated on the first sight: most machines never see another
		// incarnation, and 96 bytes each would take the machine a size
		// class up.
		m.dups = new([4]dupWrite)
	}
	i := slices.IndexFunc(m.dups[:], func(d dupWrite) bool { return d.inc == r.Incarnation })
	if i < 0 {
		copy(m.dups[1:], m.dups[:])
		i, m.dups[0] = 0, dupWrite{inc: r.Incarnation}
	}
	d := &m.dups[i]
	switch rev := r.Revision; {
	case rev == d.top || rev == d.next || rev < d.next:
		return
	case rev > d.top:
		d.top, d.next = rev, d.top
	default:
		d.next = rev
	}
	m.dupCheck(i)
}

// dupCheck reports the incarnation of m.dups[i] once two of its writes
// are known to be committed since this process started (see dupSeen).
func (m *machine) dupCheck(i int) {
	d := m.dups[i]
	if m.startRev == 0 || d.next < m.startRev {
		return
	}
	first := m.health.DuplicateSeen.IsZero()
	m.health.DuplicateSeen, m.healthChanged = m.now, true
	if !first {
		return
	}
	err := fmt.Errorf("%w: node id %q of election %q is used by another process (its records carry incarnation %d, this process's is %d)",
		ErrDuplicateID, m.id, m.election, d.inc, m.inc)
	m.do(logLine{level: slog.LevelError, msg: "leaderfeed: node id is used by another process", args: []any{"revision", d.top, "err", err}})
	m.emit(Event{Type: EventError, Err: err})
}

// handedToMe reports whether r hands the election to this process in one
// write (case 5 of the safety argument, see claimDue): it names this node,
// with the token of one of its recent presence writes, and when that write
// was sent.
func (m *machine) handedToMe(r heartbeat.Record) (time.Time, bool) {
	if m.pres == nil || r.Handover == 0 || r.Leader != m.id || r.Revision == 0 {
		return time.Time{}, false
	}
	return m.pres.tokenSent(r.Handover)
}

// handedOK is handedToMe without the send time.
func (m *machine) handedOK(r heartbeat.Record) bool {
	_, ok := m.handedToMe(r)
	return ok
}

// takeHandover leads on the known record if it hands the election to this
// process and the lease it grants still runs (case 5): from the send of
// the presence write whose token it carries, for the shorter of this
// node's LeaseDuration and the record's Lease. It reports whether it did.
// A follower whose lease on it is over claims it at once instead
// (claimableAtOnce).
func (m *machine) takeHandover() bool {
	if m.role != roleFollower || m.writing || m.vacancy != nil || !m.seen || m.missing {
		return false
	}
	sentAt, ok := m.handedToMe(m.rec)
	if !ok || m.own(m.rec) {
		// Not handed to this process, or handed to it and taken already:
		// a term it gave up is never led again.
		return false
	}
	end := sentAt.Add(min(m.t.LeaseDuration, m.rec.Lease))
	if !m.now.Before(end) {
		return false
	}
	if m.claimTerm != 0 {
		copy(m.claimedTerms[1:], m.claimedTerms[:])
		m.claimedTerms[0] = m.claimTerm
	}
	m.claimTerm, m.claimToken = m.rec.Term, m.rec.Handover
	m.claimSoon, m.handedOver = false, false
	rec := m.rec
	m.becomeLeader(rec, sentAt, end, m.now, true)
	m.announce(rec, rec.Term, m.now)
	return true
}

// current reports whether the reply to a call asked for in step sentStep
// (a read, a write's result, a conflict's current record) is
// authoritative: the call was asked for in the step that observed the
// known record or a later one, so the driver sent it after that record was
// committed, and the reply shows the store at or after it. A reply to a call asked for in an earlier step
// may be older than what the feed or another reply brought meanwhile.
// Steps, not clock readings, order the two: two steps may read the same
// instant (a coarse clock, testing/synctest), and a call sent at the
// instant of a later observation was still sent before it.
func (m *machine) current(sentStep uint64) bool {
	return !m.seen || sentStep >= m.observedIn
}

// observe takes in a record. The view only goes forward: the known write
// again, and records of an older revision from the feed or from a reply
// that is not authoritative (current), are ignored. Authoritative ones are
// taken whenever they are another write, which also covers a record that
// was deleted and created anew, and a store that lost acknowledged writes.
// What a node learns of its own writes from their replies (its revision,
// a lost reply adopted) is taken by the callers, whatever observe keeps.
func (m *machine) observe(r heartbeat.Record, authoritative bool) {
	if r.Revision == 0 {
		if authoritative || !m.seen || m.missing {
			m.observeMissing()
		}
		return
	}
	if m.role != roleObserver && r.Leader == m.id && r.Handover == 0 && !m.mine(r) {
		m.dupSeen(r) // whatever the view keeps of it: a twin's write is one
	}
	if m.seen && !m.missing {
		// The same write again, or an older one from the feed. A record of
		// the known revision but another leader or term is another write: a
		// store that lost an acknowledged write hands a revision out twice.
		if r.SameWrite(m.rec) || (!authoritative && r.Revision < m.rec.Revision) {
			return
		}
	}
	now := m.now
	m.rec, m.seen, m.missing, m.deleted, m.observedAt, m.observedIn = r.Clone(), true, false, false, now, m.steps
	m.recLease = r.Lease
	m.maxTerm = max(m.maxTerm, r.Term)
	m.snap.record, m.snap.seen = m.rec.Clone(), true
	m.publish()
	m.health.LastRecord, m.healthChanged = now, true
	if !m.quiet {
		m.do(logDebug{msg: "leaderfeed: record", args: []any{"leader", r.Leader, "term", r.Term, "revision", r.Revision}})
	}
	if m.role == roleLeader {
		if m.own(r) {
			// Our own write (possibly one whose reply we lost): only this
			// process writes its id with this term and its incarnation.
			m.myRev = max(m.myRev, r.Revision)
			m.announce(r, r.Term, now)
			return
		}
		// Leadership ends before anything else is reported.
		m.stepDown(ReasonDeposed, fmt.Errorf("leaderfeed: record names %q with term %d", r.Leader, r.Term))
	}
	if m.vacancy != nil && m.own(r) {
		m.myRev = max(m.myRev, r.Revision)
	}
	if m.role == roleCandidate && (m.own(r) || m.handedOK(r)) {
		// The feed brought this node's claim, or a handover to it, before
		// the claim's reply: announce it when the reply is in (onClaim),
		// after EventElected if it leads, so that no reader sees this node
		// as the new leader before its own elected event.
		m.armClaim(true)
		return
	}
	if m.takeHandover() {
		return
	}
	m.announce(r, r.Term, now)
	if m.passOn() {
		return
	}
	m.armClaim(true)
}

// onLeft: Stop deleted the presence record of this follower (or gave up):
// no leader that reads the participants from now on picks it. It reads the
// record once more, for a handover written before (passOn).
func (m *machine) onLeft() {
	m.leaving = false
	if m.role != roleStopping || m.writing || m.vacancy != nil {
		return
	}
	m.lastRead = true
	m.call(callRead, heartbeat.Record{}, heartbeat.Record{}, m.now.Add(m.t.ElectionTimeoutMin), m.stopCtx)
}

// passOn: a stopping participant that finds the election handed to it
// (the leader read its presence before its Stop deleted it) hands it on
// as a stopping leader would, on a fresh view of the participants, so
// that the record does not name a node that left until the others'
// election timeout. Only once its delete is done: two nodes stopping at
// once then never hand it back and forth, as each is out of the other's
// view. It never leads on it: it writes on the record it was
// handed (its own, case 5) after no step of leading, so it grants itself
// nothing. It reports whether it did.
func (m *machine) passOn() bool {
	if m.role != roleStopping || m.leaving || m.writing || m.vacancy != nil || !m.seen || m.missing || !m.handedOK(m.rec) || m.own(m.rec) {
		return false
	}
	m.term, m.myRev = m.rec.Term, m.rec.Revision
	m.claimTerm, m.claimToken = m.rec.Term, m.rec.Handover
	m.handedOver = true
	m.vacancy = &vacancyWrite{ctx: m.stopCtx, term: m.rec.Term}
	m.vacancyTerm = m.rec.Term
	m.do(logLine{level: slog.LevelInfo, msg: "leaderfeed: handed the election while stopping: handing it on", args: []any{"term", m.rec.Term}})
	m.handOver(false)
	return true
}

// observeMissing takes in that the store has no record.
func (m *machine) observeMissing() {
	if m.missing && m.seen {
		return
	}
	wasSeen := m.seen && !m.missing
	now := m.now
	m.rec = heartbeat.Record{Election: m.election}
	m.seen, m.missing, m.deleted, m.observedAt, m.observedIn = true, true, wasSeen, now, m.steps
	m.snap.record, m.snap.seen = m.rec.Clone(), true
	m.publish()
	if m.role == roleLeader {
		m.stepDown(ReasonDeposed, errors.New("leaderfeed: election record was deleted"))
	}
	m.announce(m.rec, m.maxTerm, now)
	m.armClaim(true)
}

// announce emits EventNewLeader for rec unless its leader, term and value
// were announced last (a renewal is no news); term is the event's, which
// for a missing record is the highest term seen.
func (m *machine) announce(rec heartbeat.Record, term uint64, at time.Time) {
	if m.announced.ok && m.announced.leader == rec.Leader && m.announced.term == term && bytes.Equal(m.announced.value, rec.Value) {
		return
	}
	rec = rec.Clone()
	m.announced.leader, m.announced.term, m.announced.value, m.announced.ok = rec.Leader, term, bytes.Clone(rec.Value), true
	m.emit(Event{Type: EventNewLeader, At: at, Leader: rec.Leader, Term: term, Value: rec.Value, Record: rec})
}

// ---- campaigning ----

// claimDue reports whether a claim on the known revision may be sent now:
// case 1 of the argument below, or one of the others (claimableAtOnce).
//
// # Why there is never more than one leader
//
// A node leads on revision R from the SEND time s of the compare-and-set
// (claim or renewal) that wrote R until s+LeaseDuration, on its own
// monotonic clock, and only if the reply came back before that (the lease
// context's Err checks the clock; every transition to leading checks it).
// A handover written by the previous leader (case 5) grants its lease from
// an s that also precedes R's commit, for at most R.Lease. Any other
// node's successful compare-and-set must be on R or a later revision, so
// it happens after R was committed, hence after s. A node sends a claim on
// revision R only in these cases (claimDue):
//
//  1. It first observed R at least W ago, and has seen no newer revision
//     since, where W is the larger of its own ElectionTimeoutMin and
//     heartbeat.FollowerWait(R.Lease). R.Lease is the writer's own
//     LeaseDuration, written into R by the same compare-and-set. The node
//     observed R after R was committed, so after s; the claim is sent
//     after s+W > s+R.Lease: the lease R granted has ended, whatever the
//     writer's Timing. (W exceeds R.Lease by at least a tenth of W, the
//     margin for clock rates and scheduling. For a record without a lease,
//     written before records carried one, W is ElectionTimeoutMin and the
//     Timing rule LeaseDuration < ElectionTimeoutMin is what holds, as long
//     as all nodes share a Timing.) A deleted record counts with the lease
//     of the last record seen before it.
//  2. R is vacant, and not reserved for another node (R.Successor is empty
//     or this node). Vacancies are written only by the holder of R-1's
//     term after it stepped down (stepDown cancels the leader context
//     before the vacancy is sent, for Resign, Stop and a transfer alike),
//     so R grants nobody a lease. A vacancy reserved for a successor (a
//     transfer) is still a vacancy: its writer holds no lease once it is
//     written, and the successor's claim is an ordinary compare-and-set on
//     R, refused if anyone wrote since. Every other node claims a reserved
//     vacancy only under case 1, as if it were a heartbeat (W with
//     R.Lease = 0, so its own ElectionTimeoutMin): not for safety, which
//     case 2 gives already, but so that the successor wins unless it is
//     dead, and a dead successor costs no more than a crashed leader.
//  3. R was written by this process itself (a record naming its node id
//     with the term of its last claim or of one of the few claims it sent
//     before that, no handover token, and this process's incarnation, see
//     ownClaim), and it does not lead on R: a claim or renewal whose reply
//     came after its lease, or was lost, or a lease that ran out while a
//     renewal was in flight. The only lease R can have granted is this
//     process's own, which it does not hold; it claims with a new term.
//     Node ids are the user's to choose and may be shared by two
//     processes; incarnations are drawn by each process at random (one in
//     2^53), so R's incarnation tells this process's writes from those of
//     another with the same id, which this process treats as any other
//     node's (case 1). A record without an incarnation (a store or writer
//     of an older version) counts as the node's own by its id, as before
//     incarnations, which is safe only with unique ids. (R naming it with
//     the term of a claim of its own but a handover token was written by
//     another node: case 5 or case 1.)
//  4. The store never had a record (Revision 0): nobody ever led.
//  5. R hands the election to this process: the leader of R-1 wrote R
//     naming this node with a new term, R.Lease its own LeaseDuration, and
//     R.Handover the token of a presence write of this node that it read
//     before (successor). Only this process drew that token (one of its
//     last few, tokenSent), and it sent that write at p before it was
//     committed, which is before the leader read it, before R was
//     written. So p precedes R's commit like the send of a claim, and the
//     node leads on R from p until p+min(LeaseDuration, R.Lease) if it
//     observes R before then (takeHandover). Every other node observes R
//     after its commit and treats it as a heartbeat (case 1: it waits W
//     > R.Lease), and the writer stepped down before sending R, as for a
//     vacancy. If this node observes R too late, or does not take it (it
//     is stopping), no lease runs on R: the only one R grants is this
//     process's; it claims R at once, with a new term. A token of another
//     process (an earlier one with the same node id) grants it nothing:
//     case 1.
//
// A claim on an older revision than the store's fails the compare-and-set.
// The known revision only goes forward (observe): an older record replaces
// it only when it comes from a call sent after the known one was observed
// (a store that lost writes), and case 1 then counts W from that reply.
// "Sent after" is judged by the machine's step numbers, not by clock
// readings (current): the call was asked for in the step that observed the
// known record or a later one, so the driver sent it after that record
// was committed. Two steps may read one clock value (a coarse clock,
// testing/synctest), so a reply to a call sent at the same reading as a
// later observation is older than what that observation brought.
// So when a claim succeeds, every earlier lease has ended: never two
// leaders. Terms strictly increase because a claim writes a term above
// every term the node has seen, and the compare-and-set orders the writes.
//
// The times this rests on are step's now, which the driver reads after the
// input arrived: an observation's time (observedAt) is after the record
// was committed, and a call's sentAt is before the driver sends it, so a
// lease counted from sentAt ends no later than one counted from the send.
func (m *machine) claimDue(now time.Time) bool {
	return m.claimableAtOnce() || !now.Before(m.observedAt.Add(m.claimWait()))
}

// claimableAtOnce: cases 2 to 5 of the safety argument (see claimDue): a
// vacancy made by another node (not reserved for a third one), a record
// this node wrote or was handed and does not lead on, or an election whose
// record never existed.
func (m *machine) claimableAtOnce() bool {
	if m.missing {
		return !m.deleted
	}
	if m.rec.Vacant() {
		if m.rec.Successor != "" && m.rec.Successor != m.id {
			return false // reserved for another node: wait as for a heartbeat (case 1)
		}
		return m.vacancyTerm == 0 || m.rec.Term != m.vacancyTerm
	}
	if m.handedOK(m.rec) && !m.own(m.rec) {
		// Handed to this node, which never led on it (whether or not it
		// gave up a term of its own before).
		return true
	}
	return m.ownClaim(m.rec) && !m.handedOver
}

// ownClaim reports whether r is the write of one of this node's own recent
// claims: its last (own) or one of the few before it, whose reply was lost
// while a later claim was already sent, or a handover to this process.
// Only this node writes its id with a term it chose and no token, and only
// this process drew its tokens, so the only lease r can have granted is
// this node's own (cases 3 and 5 of the safety argument, see claimDue).
func (m *machine) ownClaim(r heartbeat.Record) bool {
	if m.own(r) {
		return true
	}
	if m.handedOK(r) {
		return true
	}
	if r.Revision == 0 || r.Leader != m.id || r.Term == 0 || r.Handover != 0 || !m.mine(r) {
		return false
	}
	for _, t := range m.claimedTerms {
		if t == r.Term {
			return true
		}
	}
	return false
}

// claimWait is W of case 1: how long after observing the known revision a
// claim on it may be sent. The record's lease, written by its writer, wins
// over this node's own timing when it is longer: nodes of different
// Timings then never lead at once.
func (m *machine) claimWait() time.Duration {
	return max(m.t.ElectionTimeoutMin, heartbeat.FollowerWait(m.recLease))
}

// silentSpreadDivisor: the elections of a process judge a silent leader
// together within a sixteenth of the election timeout's span of the first
// one's timeout (leaderSilent), so that the processes that survive a
// leader's crash claim the elections already due at different instants:
// the first takes them, and the others find them taken. Elections not yet
// due are claimed at the first instant case 1 allows by every process
// that heard, and one claim of each wins.
const silentSpreadDivisor = 16

// leaderSilent tells the other elections of the process (an Elections)
// that this one's election timer found the node leader silent for its
// whole wait; they hear of it (silentInput) within spread. Each Feed of
// a process draws its own incarnation, so the node id is what its
// elections share.
type leaderSilent struct {
	leader string
	spread time.Duration
}

func (leaderSilent) isEffect() {}

// silentInput: another election of the process found the node leader
// silent (leaderSilent).
type silentInput struct{ leader string }

func (silentInput) isInput() {}

// onSilent: mass failover. A leader that crashed goes silent in all its
// elections at once; each would claim at a timeout drawn for it alone,
// and a thousand such draws spread the failovers over the whole span of
// the election timeout. When another election of this process found the
// leader of this one's record silent, this one claims as soon as case 1
// of the safety argument allows: claimWait after it observed the record
// (the timer is moved earlier, never past that; claimDue decides when it
// fires). Nothing else changes: each election still waits out its own
// record's lease, so a leader that is only slow in one election loses
// none of the others, and one alive (its renewals observed) loses none.
func (m *machine) onSilent(in silentInput) {
	if m.role != roleFollower || m.writing || !m.seen || m.missing || m.rec.Vacant() ||
		m.rec.Leader != in.leader || m.claimableAtOnce() {
		return
	}
	at := m.observedAt.Add(m.claimWait())
	if at.Before(m.now) {
		at = m.now
	}
	m.setTimer(timerClaim, at)
}

// armClaim (re)arms the election timer of a follower. fresh says the known
// revision just changed, so a new random timeout is drawn; otherwise (after
// a failed attempt) it retries after a heartbeat interval, never earlier than
// the timeout allows.
func (m *machine) armClaim(fresh bool) {
	if m.role != roleFollower {
		m.stopTimer(timerClaim)
		return
	}
	var at time.Time
	switch {
	case m.claimableAtOnce():
		d := m.t.Jitter(m.rand)
		if !fresh {
			d += m.t.HeartbeatInterval
		}
		at = m.now.Add(d)
		if !m.handedOK(m.rec) && m.ownClaim(m.rec) {
			at = m.now.Add(m.t.HeartbeatInterval) // after a failed attempt
			if fresh || m.claimSoon {
				// At once, but not sooner than a heartbeat after the
				// last claim: a store that loses every reply must not
				// get a storm of claims.
				at = m.claimSentAt.Add(m.t.HeartbeatInterval)
			}
		}
	case fresh:
		// The random timeout, moved later as a whole when the record's
		// lease asks for a longer wait than this node's own timing.
		at = m.observedAt.Add(m.t.ElectionTimeout(m.rand) + m.claimWait() - m.t.ElectionTimeoutMin)
	default:
		at = m.observedAt.Add(m.claimWait())
		if d := m.now.Add(m.t.HeartbeatInterval); at.Before(d) {
			at = d
		}
	}
	if at.Before(m.now) {
		at = m.now
	}
	m.setTimer(timerClaim, at)
}

func (m *machine) jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	if m.rand != nil {
		return time.Duration(m.rand.Int64N(int64(d) + 1))
	}
	return heartbeat.Timing{VacancyJitter: d}.Jitter(nil)
}

func (m *machine) onClaimTimer() {
	if m.role != roleFollower || m.writing || !m.seen {
		return
	}
	if !m.claimDue(m.now) {
		m.armClaim(false)
		return
	}
	if m.together && !m.claimableAtOnce() && !m.rec.Vacant() {
		// The leader went silent (case 1): the other elections of this
		// process that it leads judge it with this one (onSilent).
		m.do(leaderSilent{leader: m.rec.Leader, spread: (m.t.ElectionTimeoutMax - m.t.ElectionTimeoutMin) / silentSpreadDivisor})
	}
	m.claimSoon, m.handedOver = false, false
	next := heartbeat.Record{
		Election: m.election,
		Leader:   m.id,
		Term:     max(m.maxTerm, m.rec.Term) + 1,
		Value:    m.value,
		Lease:    m.t.LeaseDuration,
		// Only this process writes this incarnation: its claim is its
		// own even when another process uses this node id (own).
		Incarnation: m.inc,
	}
	if m.claimTerm != 0 {
		copy(m.claimedTerms[1:], m.claimedTerms[:])
		m.claimedTerms[0] = m.claimTerm
	}
	m.claimTerm, m.claimToken = next.Term, 0
	m.claimSentAt = m.now
	m.maxTerm = next.Term
	m.role, m.writing = roleCandidate, true
	m.call(callClaim, m.rec, next, m.now.Add(m.t.LeaseDuration), nil)
}

func (m *machine) onClaim(r callResult) {
	m.handleClaim(r)
	if m.takeHandover() {
		return // handed over while the claim was in flight
	}
	// A record that observe held back while the claim was in flight (its
	// own claim, seen on the feed first) is announced now; announce skips
	// what was announced already.
	if m.seen && !m.missing && m.role != roleCandidate {
		m.announce(m.rec, m.rec.Term, m.now)
	}
}

func (m *machine) handleClaim(r callResult) {
	now := m.now
	stopping := m.role == roleStopping
	if !stopping {
		m.role = roleFollower
	}
	var conflict *backend.ConflictError
	switch {
	case r.err == nil:
		if r.res.Revision != r.expected.Revision+1 || r.res.Leader != r.next.Leader || r.res.Term != r.next.Term {
			m.emit(Event{Type: EventError, Err: fmt.Errorf("leaderfeed: backend returned %v for a claim of term %d on revision %d", r.res, r.next.Term, r.expected.Revision)})
			m.observe(r.res, m.current(r.sentStep))
			return
		}
		if stopping {
			// Won while stopping: hand over at once.
			m.term, m.myRev = r.res.Term, r.res.Revision
			m.vacancy = &vacancyWrite{ctx: m.stopCtx, term: r.res.Term}
			m.vacancyTerm = r.res.Term
			m.observe(r.res, m.current(r.sentStep))
			return
		}
		if !now.Before(r.sentAt.Add(m.t.LeaseDuration)) {
			// Won, but the lease the claim granted is over: the record is
			// ours and nobody leads on it, so claim it again at once
			// (case 3) rather than leave everyone waiting for a timeout.
			m.emit(Event{Type: EventError, Err: fmt.Errorf("leaderfeed: claim of term %d took %v, longer than the lease: %w", r.next.Term, now.Sub(r.sentAt), errLeaseOver)})
			m.claimSoon = true
			m.observe(r.res, m.current(r.sentStep))
			return
		}
		if m.seen && !m.missing && r.res.Revision < m.rec.Revision {
			// A later write was observed already: the claim was written
			// over (only after its lease, case 1); the view stays.
			return
		}
		m.becomeLeader(r.res, r.sentAt, r.sentAt.Add(m.t.LeaseDuration), now, m.current(r.sentStep))
	case errors.As(r.err, &conflict):
		if !m.quiet {
			m.do(logDebug{msg: "leaderfeed: claim lost", args: []any{"term", r.next.Term, "current_revision", conflict.Current.Revision}})
		}
		m.observe(conflict.Current, m.current(r.sentStep))
	case r.closed:
	default:
		m.emit(Event{Type: EventError, Err: fmt.Errorf("leaderfeed: claim term %d: %w", r.next.Term, r.err)})
	}
}

// ---- leading ----

// becomeLeader starts a term won by a claim sent at sentAt (or handed
// over, case 5), whose lease ends at end, checked against the lease at
// now. EventElected is stamped now, the instant the lease was known to
// run: a later clock reading could fall after the lease's end, and the
// lease-expired EventUnelected (stamped at that end) would then precede
// the term's start.
func (m *machine) becomeLeader(res heartbeat.Record, sentAt, end, now time.Time, current bool) {
	m.role = roleLeader
	m.term, m.myRev, m.lastErr = res.Term, res.Revision, nil
	m.leaseEnd = end
	m.leaderCtx = newLeaseContext(m.leaseEnd)
	m.stopTimer(timerClaim)
	m.do(m.arena().leases.add(armLease{ctx: m.leaderCtx, end: m.leaseEnd}))
	m.snap.leader, m.snap.term, m.snap.leaderCtx = true, m.term, m.leaderCtx
	m.snapLeaseTo = m.leaseEnd
	m.publish()
	m.emit(Event{Type: EventElected, At: now, Term: m.term, Record: res.Clone(), LeaderCtx: m.leaderCtx})
	m.observe(res, current)
	m.do(m.arena().timers.add(setTimer{t: timerRenew, at: sentAt.Add(m.t.HeartbeatInterval), align: true}))
	if m.pres != nil {
		// Read the participants at once, not a presence interval into the
		// term: a term that ends early hands over in one write too.
		m.setTimer(timerPresence, now)
	}
}

// startRenew sends the leader's heartbeat: a compare-and-set on its own
// last revision, bounded by the lease.
func (m *machine) startRenew() {
	if m.role != roleLeader {
		return
	}
	if m.writing {
		m.renewNow = true
		return
	}
	m.writing = true
	// This renewal carries the newest value of the Proclaims so far; those
	// whose caller gave up (it was told its ctx's error) are dropped.
	for _, p := range m.proclaims {
		if p.ctx != nil && p.ctx.Err() != nil {
			m.do(reply{to: p.reply, err: p.ctx.Err()})
		} else {
			m.carried = append(m.carried, p)
		}
	}
	m.proclaims = nil
	value := m.value
	if n := len(m.carried); n > 0 {
		value = m.carried[n-1].value
	}
	next := heartbeat.Record{Election: m.election, Leader: m.id, Term: m.term, Value: value, Lease: m.t.LeaseDuration, Incarnation: m.inc}
	m.call(callRenew, heartbeat.Record{Revision: m.myRev, Leader: m.id, Term: m.term}, next, m.leaseEnd, nil)
}

// onRenew takes in a renewal's result. It reports true when it asked the
// driver to extend the lease (extendLease): the rest is onLeaseExtended.
func (m *machine) onRenew(r callResult) bool {
	leading := m.role == roleLeader && m.term == r.next.Term
	var conflict *backend.ConflictError
	switch {
	case r.err == nil:
		m.myRev = max(m.myRev, r.res.Revision)
		if !leading {
			m.observe(r.res, m.current(r.sentStep))
			return false
		}
		newEnd := r.sentAt.Add(m.t.LeaseDuration)
		if !m.now.Before(newEnd) {
			m.onLeaseExtended(r.res, r.sentAt, m.current(r.sentStep), false)
			return false
		}
		m.extending = extending{res: r.res, sentAt: r.sentAt, sentStep: r.sentStep}
		m.do(m.arena().extends.add(extendLease{ctx: m.leaderCtx, end: newEnd}))
		return true
	case errors.As(r.err, &conflict) && m.own(conflict.Current):
		// The store holds our own later write: an earlier renewal committed
		// but its reply was lost. Take the revision and renew on it at
		// once; the lease still runs from the last reply that came back.
		m.myRev = max(m.myRev, conflict.Current.Revision)
		if leading {
			m.renewNow = true
			m.uncarry() // the next renewal carries their value again
		} else {
			m.observe(conflict.Current, m.current(r.sentStep))
		}
	case errors.As(r.err, &conflict):
		if leading {
			m.stepDown(ReasonDeposed, r.err)
		}
		m.observe(conflict.Current, m.current(r.sentStep))
	default:
		if !leading {
			return false
		}
		m.lastErr = r.err
		m.uncarry() // the retry carries their value
		if !r.closed {
			m.emit(Event{Type: EventError, Err: fmt.Errorf("leaderfeed: renew term %d: %w", m.term, r.err)})
		}
		// Retry soon; the lease timer steps down if no retry gets through.
		m.setTimer(timerRenew, m.now.Add(max(time.Millisecond, m.t.HeartbeatInterval/5)))
	}
	return false
}

// onLeaseExtended ends a successful renewal of the term this node leads:
// extended says the leader context took the renewal's lease.
func (m *machine) onLeaseExtended(res heartbeat.Record, sentAt time.Time, current, extended bool) {
	if !extended {
		// The lease ran out before the reply: leadership is over (the
		// record is ours: case 3 lets this node claim it again).
		m.lastErr = errLeaseOver
		m.stepDown(ReasonLeaseExpired, errLeaseOver)
		m.observe(res, current)
		return
	}
	newEnd := sentAt.Add(m.t.LeaseDuration)
	m.leaseEnd, m.lastErr = newEnd, nil
	m.do(m.arena().leases.add(armLease{ctx: m.leaderCtx, end: newEnd}))
	m.snapLeaseTo = newEnd
	m.publish()
	if !m.quiet {
		m.do(logDebug{msg: "leaderfeed: renewed", args: []any{"term", m.term, "revision", res.Revision}})
	}
	// The Proclaims this renewal carried are done, and the value of the
	// last one whose caller still waits is in force; those made while it
	// was in flight wait for the next one (renewNow). A caller that gave
	// up was told its context's error: its value has no later effect (the
	// next renewal writes the value in force again).
	for _, c := range m.carried {
		if c.settle.take() {
			m.value = c.value
			m.do(reply{to: c.reply})
		} else {
			m.do(reply{to: c.reply, err: c.ctx.Err()})
		}
	}
	m.carried = nil
	if !bytes.Equal(res.Value, m.value) {
		m.renewNow = true // a given-up value: write the one in force back now
	}
	m.observe(res, current)
	m.do(m.arena().timers.add(setTimer{t: timerRenew, at: sentAt.Add(m.t.HeartbeatInterval), align: true}))
}

// replyProclaims answers every waiting Proclaim with err; their values are
// forgotten.
func (m *machine) replyProclaims(err error) {
	for _, c := range append(m.carried, m.proclaims...) {
		m.do(reply{to: c.reply, err: err})
	}
	m.carried, m.proclaims = nil, nil
}

// uncarry puts the Proclaims the renewal that just failed carried back
// with those waiting for a renewal.
func (m *machine) uncarry() {
	m.proclaims, m.carried = append(m.carried, m.proclaims...), nil
}

func (m *machine) onLeaseLost(expired bool) {
	if m.role != roleLeader || !expired {
		return // a signal of an earlier term, or of a lease since extended
	}
	m.stepDown(ReasonLeaseExpired, m.lastErr)
	m.afterWrite()
}

// stepDown ends this node's leadership: the leader context is cancelled
// (with the reason's cause) before anything else. The event's At is the end
// of the lease when it ran out, else the moment after the cancellation
// (never after the lease's end): no holder of the leader context finds it
// live after At.
func (m *machine) stepDown(reason Reason, err error) {
	if m.role != roleLeader {
		return
	}
	m.do(cancelLeader{ctx: m.leaderCtx, cause: reason.cause()})
	m.stopTimer(timerLease)
	m.stopTimer(timerRenew)
	m.renewNow = false
	var at time.Time // the driver's instant of the cancellation
	if reason == ReasonLeaseExpired || m.now.After(m.leaseEnd) {
		at = m.leaseEnd
	}
	m.role = roleFollower
	m.snap.leader = false
	m.publish()
	m.replyProclaims(ErrNotLeader)
	m.do(m.arena().emits.add(emit{ev: Event{Type: EventUnelected, At: at, Term: m.term, Reason: reason, Err: err}, notAfter: m.leaseEnd}))
}

// ---- handing over ----

// startVacancy writes the vacant record on the newest revision this node
// wrote, once no other write is in flight. The driver does not send it if
// its context has ended (vacancyAbortedInput).
func (m *machine) startVacancy() {
	v := m.vacancy
	if v == nil || m.writing || v.viewing {
		return
	}
	m.writing, v.inFlight = true, true
	v.attempts++
	var deadline time.Time
	if v.timeout > 0 {
		deadline = m.now.Add(v.timeout)
	}
	next := heartbeat.Record{Election: m.election, Term: v.term, Successor: v.successor}
	if v.to.Node != "" {
		next = heartbeat.Record{Election: m.election, Leader: v.to.Node, Term: v.term + 1, Value: v.to.Value, Lease: m.t.LeaseDuration, Handover: v.to.Token}
		m.maxTerm = max(m.maxTerm, next.Term)
	}
	m.do(m.arena().calls.add(startCall{kind: callVacancy, expected: heartbeat.Record{Revision: m.myRev, Leader: m.id, Term: v.term}, next: next,
		sentAt: m.now, sentStep: m.steps, deadline: deadline, parent: v.ctx, guard: v.guard}))
}

func (m *machine) endVacancy(err error) {
	v := m.vacancy
	m.vacancy = nil
	if err == nil && v.left != "" {
		err = fmt.Errorf("leaderfeed: transfer to %q: %w: it withdrew before the handover, which went to the next participant instead", v.left, ErrUnknownParticipant)
	}
	switch {
	case v.reply != nil:
		m.do(reply{to: v.reply, err: err})
	case err != nil && (v.transfer || v.left != ""):
		m.do(logLine{level: slog.LevelInfo, msg: "leaderfeed: priority handover failed", args: []any{"to", v.successor, "err", err}})
	case err != nil:
		m.emit(Event{Type: EventError, Err: fmt.Errorf("leaderfeed: stop: %w", err)})
	}
	if m.takeHandover() {
		return // handed back to this node while its own write was in flight
	}
	m.armClaim(false)
}

func (m *machine) onVacancy(r callResult) {
	v := m.vacancy
	v.inFlight = false
	var conflict *backend.ConflictError
	switch {
	case r.err == nil:
		m.observe(r.res, m.current(r.sentStep))
		m.endVacancy(nil)
	case errors.As(r.err, &conflict) && m.own(conflict.Current):
		// A renewal of ours committed with its reply lost: write the
		// vacancy on it (startVacancy runs again in afterWrite).
		m.myRev = conflict.Current.Revision
		if v.attempts >= 5 {
			m.endVacancy(fmt.Errorf("leaderfeed: vacant record not written: %w", r.err))
		}
	case errors.As(r.err, &conflict):
		// Either our own vacancy committed and its reply was lost, or
		// another node took over already: either way the election is
		// handed over. A transfer says which: the successor has it (or
		// its reserved vacancy is in the store), or somebody else took
		// over before the vacancy was written.
		cur := conflict.Current
		m.observe(cur, m.current(r.sentStep))
		var err error
		if v.transfer && cur.Leader != v.successor && !(cur.Reserved() && cur.Successor == v.successor && cur.Term == v.term) {
			err = fmt.Errorf("leaderfeed: transfer to %q: the record was written by another node first (%v): %w", v.successor, cur, backend.ErrConflict)
		}
		m.endVacancy(err)
	case v.guard.Node != "" && errors.Is(r.err, backend.ErrUnsupported):
		// The backend cannot guard the write: nothing was written. Write
		// it unguarded, on a read of the participants made now (handOver)
		// unless it is a transfer, which names its target.
		m.noGuard, v.guard = true, backend.Guard{}
		if !v.transfer {
			m.handOver(false)
		}
	case v.guard.Node != "" && errors.Is(r.err, backend.ErrNotPresent):
		// The participant it named withdrew since the leader read the
		// participants: nothing was written. Read them and pick again;
		// after a few such rounds, the vacancy is for whoever claims.
		m.debug("leaderfeed: the successor withdrew before the handover", "node", v.guard.Node)
		m.pres.live, m.pres.readAt = nil, time.Time{}
		if v.transfer {
			v.left, v.transfer, v.successor = v.successor, false, ""
		}
		if v.attempts >= 5 {
			v.to, v.successor, v.guard = backend.Presence{}, "", backend.Guard{}
			return
		}
		m.handOver(false)
	default:
		// The vacancy may have committed: write it again while the
		// caller's context allows; a committed one comes back as a
		// conflict carrying it.
		if r.parentDone || r.closed || v.attempts >= 5 {
			m.endVacancy(fmt.Errorf("leaderfeed: vacant record not written (the others take over after their election timeout): %w", r.err))
		}
	}
}

func (m *machine) onRequest(r request) {
	switch r.kind {
	case reqResign:
		if m.role != roleLeader {
			m.do(reply{to: r.reply, err: ErrNotLeader})
			return
		}
		m.stepDown(ReasonResigned, nil)
		m.handedOver = true
		m.vacancy = &vacancyWrite{ctx: r.ctx, reply: r.reply, term: m.term}
		m.vacancyTerm = m.term
		if m.fromView() {
			m.startVacancy()
			return
		}
		m.handOver(false)
	case reqTransfer:
		switch {
		case m.role != roleLeader:
			m.do(reply{to: r.reply, err: ErrNotLeader})
			return
		case r.target == m.id:
			m.do(reply{to: r.reply, err: ErrTransferToSelf})
			return
		}
		m.transfer(r.target, &vacancyWrite{ctx: r.ctx, reply: r.reply})
	case reqProclaim:
		if m.role != roleLeader {
			m.do(reply{to: r.reply, err: ErrNotLeader})
			return
		}
		m.proclaims = append(m.proclaims, proclaim{ctx: r.ctx, reply: r.reply, value: r.value, settle: r.settle})
		m.startRenew()
	case reqStatus:
		m.do(reply{to: r.reply, err: nil})
	default:
		m.do(reply{to: r.reply, err: fmt.Errorf("leaderfeed: unknown request %d", r.kind)})
	}
}

// transfer steps down (EventUnelected before anything else), then hands
// the election to target in one write if it read a token of target, else
// writes the vacancy v reserved for target: only the target may claim it
// at once (see claimableAtOnce). The node leads.
func (m *machine) transfer(target string, v *vacancyWrite) {
	m.pick(v, target)
	m.stepDown(ReasonTransferred, nil)
	m.handedOver = true
	v.term, v.successor, v.transfer = m.term, target, true
	m.vacancy = v
	m.vacancyTerm = m.term
	m.startVacancy()
}

// onStop: step down (EventUnelected first), then write the vacancy; the
// engine ends when no write is in flight (done).
func (m *machine) onStop(ctx context.Context) {
	if ctx == nil {
		ctx = context.Background()
	}
	m.stopCtx = ctx
	wasLeader := m.role == roleLeader
	m.stepDown(ReasonStopped, nil)
	m.role = roleStopping
	m.stopTimer(timerClaim)
	m.stopTimer(timerPoll)
	m.stopTimer(timerReopen)
	if m.pres != nil {
		m.stopTimer(timerPresence)
		if !wasLeader {
			// Then a last read (onLeft): a handover written before any
			// leader could see the delete is passed on (passOn).
			m.leaving = true
			m.do(leavePresence{ctx: ctx, tell: true})
		}
	}
	if wasLeader {
		m.handedOver = true
		m.vacancy = &vacancyWrite{ctx: m.stopCtx, term: m.term}
		m.vacancyTerm = m.term
		m.handOver(true)
	}
}

// fromView picks the successor of m.vacancy (Resign) from the leader's
// last read of the participants, without a read now, when that read
// names one young enough for the handover in one write (successor) and
// the backend guards the write (backend.GuardElection): the write then
// names a participant whose presence record is still in the store when
// it commits, or is not made (ErrNotPresent: onVacancy reads and picks
// again), so a node that withdrew since the read is never named. The
// read is at most two presence intervals old (successor): a node that
// joined since is not a candidate yet. A successor whose token has grown
// too old since is read afresh (handOver) rather than reserved a vacancy:
// one write, not two, with the default PresenceInterval.
func (m *machine) fromView() bool {
	if m.pres == nil || m.noGuard {
		return false
	}
	m.pick(m.vacancy, "")
	return m.vacancy.to.Node != "" && m.vacancy.guard.Node != ""
}

// pick sets the successor of v from the leader's view (successor): to,
// or the successor of a reserved vacancy, and the guard of the write.
func (m *machine) pick(v *vacancyWrite, node string) {
	to, reserve := m.successor(node)
	v.to, v.successor, v.guard = to, reserve.Node, backend.Guard{}
	c := to
	if c.Node == "" {
		c = reserve
	}
	if c.Node != "" && !m.noGuard {
		v.guard = backend.Guard{Node: c.Node, Incarnation: c.Incarnation}
	}
}

// handOver writes m.vacancy, the end of a term the node gave up (Resign,
// Stop), to the successor it picks on a fresh read of the participants
// (successor), made after it stepped down: every withdrawal committed
// before it is in that view, so a node that left or is leaving (its Stop
// withdrew its presence, leave here) is never handed the election; the
// guarded write (pick) also refuses one whose withdrawal commits between
// the read and the write. A stopping leader (leave) withdraws its own
// presence first: a node that takes over from it and hands over in turn
// never picks it, and a node that joined just before it stopped (a rolling
// restart) is in the read. Without presence, or if the read fails, the
// vacancy is for whoever claims first.
func (m *machine) handOver(leave bool) {
	v := m.vacancy
	if m.pres == nil {
		m.startVacancy()
		return
	}
	v.viewing = true
	m.do(handoverView{ctx: v.ctx, leave: leave})
}

// onHandoverView takes in the read of handOver and writes the vacancy.
func (m *machine) onHandoverView(r handoverViewResult) {
	v := m.vacancy
	if v == nil || !v.viewing {
		return
	}
	v.viewing = false
	p := m.pres
	if r.err != nil {
		m.debug("leaderfeed: participants not read for the handover", "err", r.err)
		p.live, p.readAt = nil, time.Time{} // a stale view may name a node that left
	} else {
		p.live, p.readAt, p.storeAt = livePresences(r.ps, r.storeNow, p.ttl), m.now, r.storeNow
	}
	m.pick(v, "")
	m.startVacancy()
}
