package base

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/internal/storewait"
)

// defaultMaxPendingChanges is the default of Options.MaxPendingChanges.
const defaultMaxPendingChanges = 10000

// Options configures a Feed. The zero value of every field means its
// documented default.
type Options struct {
	// Timing of the election; zero fields take their defaults (see
	// heartbeat.Timing.WithDefaults). Nodes of one election may use
	// different Timings, as in a rolling change: every record carries its
	// writer's lease, and no node claims before that lease has ended.
	// heartbeat.TimingFor derives one from the longest acceptable failover.
	Timing heartbeat.Timing
	// Value is published in the record while this node leads (at most
	// heartbeat.MaxValueLen bytes), for example its address. Proclaim
	// changes it.
	Value []byte
	// ObserveOnly makes a feed that never campaigns: it follows the leader
	// and reports events, and Resign and Proclaim fail with ErrObserveOnly.
	ObserveOnly bool
	// Logger receives transitions at Info and heartbeats at Debug.
	// Default: discard.
	Logger *slog.Logger
	// Rand is the source of the randomized election timeouts and jitter.
	// Default: math/rand/v2's global source. It is used from one goroutine.
	// The numbers that tell this process's writes from another's (the
	// incarnation, presence tokens) never come from it.
	Rand heartbeat.Rand
	// MaxPendingChanges bounds, per subscription, the EventChange events
	// waiting for a slow reader; beyond it change events are dropped and
	// counted (Subscription.Dropped; Feed.Dropped for Events). Leadership
	// events are never dropped for a reader that reads.
	// Default defaultMaxPendingChanges.
	MaxPendingChanges int
	// Trace, if set, is told of each claim's and renewal's outcome and
	// latency, for metrics (see Trace). Default: none.
	Trace *Trace

	// Participate makes the node keep a presence record (node id, Value,
	// Priority, whether it can lead, the store's timestamp) in the store,
	// refreshed every PresenceInterval, so that it is listed by
	// Participants and can be the target of a transfer. It costs one write
	// per PresenceInterval, and, while the node leads, one read of the
	// participants (the Priority check). The backend must have the
	// presence capability (a PresenceStore through Elections): Start fails
	// with an error matching ErrUnsupported otherwise. Stop deletes the
	// record; the record of a node that crashed expires after PresenceTTL.
	// Default false: the node writes nothing but the election record.
	Participate bool
	// PresenceInterval is how often a participant refreshes its presence
	// record, and a participating leader reads the participants. Default:
	// a quarter of LeaseDuration (375 ms with the default Timing), what
	// the one-write handover needs: a successor leads on a handover for
	// LeaseDuration from the presence write whose token the leader read
	// when it handed over, which is up to an interval old. A successor
	// whose token is older than half of LeaseDuration is handed
	// the vacancy reserved for it instead, which it claims at once: one
	// more write, never a skipped term.
	PresenceInterval time.Duration
	// PresenceTTL is how long a presence record stays live without a
	// refresh, judged by the store's own clock (the record's timestamp
	// against the store's time when it is read). Default: presenceLives
	// (3) times PresenceInterval; at least PresenceInterval.
	PresenceTTL time.Duration
	// Priority, in [MinPriority, MaxPriority], default 0, says which node
	// should lead. A participating leader that sees a live participant of
	// strictly higher priority, present at each of its checks (once per
	// PresenceInterval) for at least PriorityHysteresis, transfers
	// leadership to it (TransferTo). Equal priorities never transfer, so
	// nodes of equal priority never hand leadership back and forth; a node
	// never takes leadership because of its priority, it is handed over;
	// observe-only nodes are never targets. Use cases: prefer the nodes of
	// the zone the clients are in (a higher priority), let a canary lead
	// only when nothing else can (a negative one).
	Priority int
	// PriorityHysteresis is how long a participant of higher priority must
	// have been continuously present, during this node's term, before the
	// leader hands over to it. Default: PresenceTTL, so that a target that
	// died right after a handover to it was decided has expired before the
	// next leader could choose it again.
	PriorityHysteresis time.Duration
}

// Feed is one node in one election. It campaigns (unless ObserveOnly),
// leads, renews, steps down and campaigns again until stopped, and reports
// what it sees as Events.
//
// The engine owns the election state and steps it one input at a time;
// the getters read a snapshot of it and are safe for concurrent use, as
// are all methods.
type Feed struct {
	b      backend.Election
	id     string
	opts   Options // as given, with the defaults filled in (Timing's too)
	log    *slog.Logger
	events *hub

	loop     *loop         // set by Start
	loopDone chan struct{} // closed when the engine has ended
	done     chan struct{} // closed when every goroutine has ended (goroutines)
	stopped  chan struct{} // closed when the first Stop has finished
	running  atomic.Int64  // goroutines of the Feed running (goroutines)
	inRun    atomic.Bool   // Run is running

	mu      sync.Mutex
	state   feedState
	stopErr error
	stopCtx context.Context // set by Stop
	cancel  context.CancelFunc
	// presCancel ends the presence writes: not when the engine ends (a
	// write cancelled then may still commit after Stop's delete, and list
	// the stopped node as a live participant that joined last), but when
	// Stop's context does, or once every goroutine ended.
	presCancel context.CancelFunc
	snap       snapshot
	leaseEnd   time.Time
	defSub     *Subscription // of Events
	health     Health        // the machine's, as published (publishHealth)

	abortStart context.CancelFunc // ends a Start under way; guarded by mu
}

type feedState int

const (
	stateNew feedState = iota
	stateStarting
	stateRunning
	stateStopped
)

// snapshot is what the getters read.
type snapshot struct {
	leader    bool
	term      uint64
	leaderCtx context.Context
	record    heartbeat.Record
	seen      bool
}

type requestKind int

const (
	reqResign requestKind = iota + 1
	reqProclaim
	reqStatus // no-op: lets tests wait until the engine took every input
	reqTransfer
)

type request struct {
	kind   requestKind
	ctx    context.Context
	value  []byte
	target string // reqTransfer: the successor
	reply  chan error
	settle *settle // reqProclaim: whether the caller gave up first
}

// New returns a Feed for node id nodeID on backend b. It validates the
// options; errors match ErrInvalidConfig. The Feed owns b from now on: Stop
// closes it.
func New(b backend.Election, nodeID string, opts Options) (*Feed, error) {
	if b == nil {
		return nil, fmt.Errorf("%w: backend is nil", ErrInvalidConfig)
	}
	if err := heartbeat.ValidateName("node id", nodeID); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if err := heartbeat.ValidateName("election name", b.Name()); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	t := opts.Timing.WithDefaults()
	if err := t.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if len(opts.Value) > heartbeat.MaxValueLen {
		return nil, fmt.Errorf("%w: Value is %d bytes, more than heartbeat.MaxValueLen (%d)", ErrInvalidConfig, len(opts.Value), heartbeat.MaxValueLen)
	}
	if opts.MaxPendingChanges < 0 {
		return nil, fmt.Errorf("%w: MaxPendingChanges is negative (%d)", ErrInvalidConfig, opts.MaxPendingChanges)
	}
	if opts.MaxPendingChanges == 0 {
		opts.MaxPendingChanges = defaultMaxPendingChanges
	}
	if err := presenceOptions(&opts, t); err != nil {
		return nil, err
	}
	opts.Timing = t
	opts.Value = bytes.Clone(opts.Value)
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("election", b.Name(), "node", nodeID)
	f := &Feed{
		b:        b,
		id:       nodeID,
		opts:     opts,
		log:      log,
		loopDone: make(chan struct{}),
		done:     make(chan struct{}),
		stopped:  make(chan struct{}),
	}
	f.events = newHub(opts.MaxPendingChanges, log)
	return f, nil
}

// presenceOptions validates the presence and priority options and fills in
// their defaults.
func presenceOptions(opts *Options, t heartbeat.Timing) error {
	var problems []string
	if opts.Priority < MinPriority || opts.Priority > MaxPriority {
		problems = append(problems, fmt.Sprintf("Priority %d is outside [%d, %d]", opts.Priority, MinPriority, MaxPriority))
	}
	if opts.PresenceInterval < 0 || (opts.PresenceInterval > 0 && opts.PresenceInterval < heartbeat.MinDuration) {
		problems = append(problems, fmt.Sprintf("PresenceInterval %v must be 0 (default) or at least %v", opts.PresenceInterval, heartbeat.MinDuration))
	}
	if opts.PresenceTTL < 0 || opts.PriorityHysteresis < 0 {
		problems = append(problems, fmt.Sprintf("PresenceTTL (%v) and PriorityHysteresis (%v) must not be negative", opts.PresenceTTL, opts.PriorityHysteresis))
	}
	if opts.PresenceInterval == 0 {
		opts.PresenceInterval = max(t.LeaseDuration/4, heartbeat.MinDuration)
	}
	if opts.PresenceTTL == 0 {
		opts.PresenceTTL = presenceLives * opts.PresenceInterval
	}
	if opts.PresenceTTL > 0 && opts.PresenceTTL < opts.PresenceInterval {
		problems = append(problems, fmt.Sprintf("PresenceTTL (%v) must be at least PresenceInterval (%v), or a live participant would drop out between refreshes", opts.PresenceTTL, opts.PresenceInterval))
	}
	if opts.PriorityHysteresis == 0 {
		opts.PriorityHysteresis = opts.PresenceTTL
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, strings.Join(problems, "; "))
	}
	return nil
}

// NodeID returns this node's id.
func (f *Feed) NodeID() string { return f.id }

// Election returns the election's name.
func (f *Feed) Election() string { return f.b.Name() }

// Timing returns the timing in force, with defaults applied.
func (f *Feed) Timing() heartbeat.Timing { return f.opts.Timing }

// Subscribe returns a subscription to the Feed's events from now on (call
// it before Start to see them all). Its channel C closes when ctx ends, when
// the subscription is closed, or after the Feed stopped and the reader has
// taken every event queued before. A reader that reads gets every event
// but EventChange, in order; change events are bounded per subscription
// (Options.MaxPendingChanges) and drops are counted (Subscription.Dropped).
// Nothing a reader does or fails to do delays the Feed or Stop; an unread
// subscription holds one goroutine and bounded memory until ctx ends or it
// is closed. Any number of subscriptions may be open at once.
func (f *Feed) Subscribe(ctx context.Context) *Subscription {
	return f.subscribe(ctx, 0)
}

func (f *Feed) subscribe(ctx context.Context, linger time.Duration) *Subscription {
	s := newSubscription(ctx, f.events, f.opts.MaxPendingChanges, linger)
	f.events.mu.Lock()
	if f.events.finished {
		s.finish()
	} else {
		f.events.subs[s] = struct{}{}
	}
	f.events.mu.Unlock()
	return s
}

// Events returns the channel of a subscription (see Subscribe) that lasts
// as long as the Feed: every call returns the same channel. After Stop, a
// reader that reads it gets every event queued before (the EventUnelected
// of Stop included), as long as it takes each within the Feed's
// ElectionTimeoutMin; then the channel is closed. What a reader that never
// took an event, or left one longer than that, has not taken is dropped and
// counted (Dropped), so that an unread channel holds nothing after Stop.
// Stop never waits for its reader.
func (f *Feed) Events() <-chan Event {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.defSub == nil {
		f.defSub = f.subscribe(context.Background(), f.opts.Timing.ElectionTimeoutMin)
	}
	return f.defSub.C
}

// Dropped returns how many events the subscription of Events dropped:
// change events beyond MaxPendingChanges waiting for its reader, and the
// events its reader left untaken too long after Stop.
func (f *Feed) Dropped() uint64 {
	f.mu.Lock()
	s := f.defSub
	f.mu.Unlock()
	if s == nil {
		return 0
	}
	return s.Dropped()
}

// Start checks and prepares the backend (Start, then Create; with
// Participate, the first presence write) and starts campaigning (or
// observing) in the background.
//
// A store that cannot be reached yet is waited for, within ctx: a refused
// connection, a name that does not resolve, a server still starting up, a
// timeout are retried, the first retry within 200 ms and then at most
// 500 ms apart (jittered), so that a store that comes up is in use within
// a second. The first failure is logged at Warn on Options.Logger, then a
// line now and then while they go on (at 5 s, 15 s, 35 s ..., at most a
// minute apart), and the end of the wait at Info. Bound the wait with
// ctx: when it ends, Start returns an error matching ctx.Err() that
// carries the last failure. What retrying cannot fix is returned at once:
// an error matching ErrRefused (a missing privilege, failed
// authentication, a missing or foreign table; it names the cause and the
// fix), ErrInvalidConfig or backend.ErrUnsupported.
//
// After a failed Start the Feed can be started again. Starting a started
// Feed returns ErrAlreadyStarted, a stopped one ErrClosed; Stop ends a
// Start that waits, which then returns ErrClosed.
func (f *Feed) Start(ctx context.Context) error {
	f.mu.Lock()
	switch f.state {
	case stateStarting, stateRunning:
		f.mu.Unlock()
		return ErrAlreadyStarted
	case stateStopped:
		f.mu.Unlock()
		return ErrClosed
	}
	f.state = stateStarting
	sctx, abort := context.WithCancel(ctx)
	defer abort()
	f.abortStart = abort
	f.mu.Unlock()

	// The incarnation is drawn before the first presence write, which
	// carries it: the store keeps when this process life joined.
	inc := drawIdentity()
	pres, err := f.prepare(sctx, inc)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.abortStart = nil
	if f.state == stateStopped { // Stop ran meanwhile and waits for stopped
		f.closeUnstarted()
		if err != nil && (ctx.Err() != nil || !errors.Is(err, context.Canceled)) {
			return err
		}
		return ErrClosed
	}
	if err != nil {
		f.state = stateNew
		return err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	f.cancel, f.presCancel = cancel, func() {}
	f.state = stateRunning
	f.loop = newLoop(f, runCtx)
	if pres != nil {
		// Only a participant writes presence records: a Feed that does
		// not keeps no context for them.
		f.loop.presCtx, f.presCancel = context.WithCancel(context.Background())
	}
	f.loop.m.inc = inc
	if p := f.loop.m.pres; p != nil && pres != nil {
		for _, s := range pres.started[max(0, len(pres.started)-presenceTokens):] {
			p.sent[p.next] = s
			p.next = (p.next + 1) % presenceTokens
		}
	}
	f.loop.pres = pres
	f.loop.start()
	f.log.Info("leaderfeed: started", "observe_only", f.opts.ObserveOnly)
	return nil
}

// prepare makes the store calls of Start, each retried while the store
// cannot be reached (storewait.Retry), and returns the presence of a
// participant.
func (f *Feed) prepare(ctx context.Context, inc uint64) (*presence, error) {
	steps := []func(context.Context) error{f.b.Start, f.b.Create}
	var pres *presence
	if f.opts.Participate {
		// The first presence record is written before the Feed runs, so
		// that a store without the capability fails Start. Like Start and
		// Create it is bounded by ctx alone, not by a refresh's timeout:
		// it may be the pool's first connection. It carries a token, as
		// every refresh does, so that the node is a successor at once: a
		// leader stopped right after it joined hands over to it. Each
		// attempt draws its own token, sent when it was sent (see
		// presence.started), for the lease a handover naming it grants.
		pb, ok := f.b.(backend.PresenceElection)
		if !ok {
			return nil, fmt.Errorf("leaderfeed: Participate: the backend (%T) has no presence capability: %w", f.b, backend.ErrUnsupported)
		}
		pres = f.newPresence(pb, inc)
		steps = append(steps, func(ctx context.Context) error {
			p := pres.p
			p.Token = drawIdentity()
			pres.started = append(pres.started, sentToken{token: p.Token, sentAt: time.Now()})
			return pb.Present(ctx, p)
		})
	}
	done := 0
	err := storewait.Retry(ctx, f.log, f.opts.Rand, func(ctx context.Context) error {
		for ; done < len(steps); done++ {
			if err := steps[done](ctx); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return pres, nil
}

// goroutineStarts counts a goroutine of the Feed about to start;
// goroutineEnds, deferred by it, closes done when it was the last. The
// engine counts as one from Start until it has ended (loop.exit), so every
// goroutine is counted while another count is held (Start counts the
// engine before anything runs; the engine starts the store calls and its
// mailbox's goroutine, which a closed mailbox never starts): the count
// reaches zero once, when the last has ended, and no goroutine waits to
// close done.
func (f *Feed) goroutineStarts() { f.running.Add(1) }

func (f *Feed) goroutineEnds() {
	if f.running.Add(-1) == 0 {
		close(f.done)
	}
}

// closeUnstarted ends a Feed that never ran; f.mu is held.
func (f *Feed) closeUnstarted() {
	close(f.loopDone)
	close(f.done)
	f.events.finish()
	f.stopErr = f.b.Close()
	close(f.stopped)
}

// Stop ends the Feed: if it leads, it cancels the leader context first
// (EventUnelected with ReasonStopped), then hands the election over or
// writes the vacant record as Resign does, so that another node leads at
// once. A participant deletes its presence record first (a leader in the
// same round trip as its read of the participants, before it writes), so
// that no leader hands the election to it once Stop returned, and none
// that took over from it hands it back. Then it stops the changefeed,
// waits for the goroutines it started and closes the backend. ctx bounds
// all of it: when ctx ends, Stop cancels what is left (the store calls end
// at once, as the backend contract requires), closes the backend and
// returns ctx.Err().
//
// Stop never waits for a reader of events: subscriptions deliver what is
// queued to readers that read, on their own goroutines. Stop is
// idempotent: later calls wait for the first to finish (or their own ctx)
// and return its result. Calls after Stop fail with ErrClosed.
func (f *Feed) Stop(ctx context.Context) error {
	f.mu.Lock()
	switch f.state {
	case stateNew:
		f.state = stateStopped
		f.closeUnstarted()
		err := f.stopErr
		f.mu.Unlock()
		return err
	case stateStarting, stateStopped:
		// Start is under way (it sees stateStopped when it returns and
		// closes stopped; abortStart ends its store calls and its wait for
		// the store), or Stop ran already: wait for its end.
		f.state = stateStopped
		if f.abortStart != nil {
			f.abortStart()
		}
		f.mu.Unlock()
		select {
		case <-f.stopped:
		case <-ctx.Done():
			return ctx.Err()
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.stopErr
	}
	f.state = stateStopped
	f.stopCtx = ctx
	f.mu.Unlock()

	f.loop.put(stopMsg{})
	var err error
	select {
	case <-f.loopDone:
	case <-ctx.Done():
		err = ctx.Err()
		f.cancel()
		f.presCancel()
		f.loop.put(cancelledMsg{})
		<-f.loopDone // the engine does no I/O: it ends at once
	}
	f.cancel() // ends the store calls still running, but presence writes
	select {
	case <-f.done:
	case <-ctx.Done():
		if err == nil {
			err = ctx.Err()
		}
		f.presCancel()
		// Backends return promptly once their context is done (the
		// contract), so this wait is short.
		<-f.done
	}
	f.presCancel()
	if cerr := f.b.Close(); err == nil && cerr != nil {
		err = cerr
	}
	f.mu.Lock()
	f.stopErr = err
	f.mu.Unlock()
	close(f.stopped)
	f.log.Info("leaderfeed: stopped")
	return err
}

// Resign gives up leadership: it cancels the leader context, then writes
// one record (bounded by ctx) so that another node leads at once. When
// this node participates, it picks from the participants its Priority
// check read (within two PresenceIntervals), with a write the store
// refuses if the one it names has withdrawn since (backend.GuardStore;
// it then reads them and writes again), or reads them first (one round
// trip) on a store without that guard or without such a read: a node
// that left is never picked. The record hands the
// election to the live participant that can lead of the highest priority,
// then the one that joined most recently (the new nodes of a rolling
// restart lead before the old ones that are stopped next), then the lowest
// node id, the order of Participants: it names it leader with a new term
// and the token of its presence write (heartbeat.Record.Handover), and
// the successor leads from the notification, without a write of its own
// (its lease runs from when it sent that presence write, so
// PresenceInterval must be well under LeaseDuration for it to still run;
// else the record is the vacancy reserved for it, which it claims at
// once). Otherwise (no participant, or the read failed) the record is
// vacant, and the first follower to claim it leads. This node goes on as a follower and claims neither at once; it
// may win a later election. It returns ErrNotLeader if the node does not
// lead, and the write's error if the record could not be written (the
// node has stepped down all the same; the others take over after their
// election timeout).
func (f *Feed) Resign(ctx context.Context) error {
	return f.request(ctx, request{kind: reqResign, ctx: ctx})
}

// Proclaim changes the value the leader publishes and writes it at once
// (like etcd's Proclaim). It returns ErrNotLeader if the node does not lead,
// or stopped leading before a renewal carried the value. The value is the
// node's from then on (later terms publish it) only if Proclaim returns
// nil: a Proclaim that fails has no later effect, though one that returns
// its context's error may have been written in this term, as any write
// whose caller gave up (the next renewal, sent at once, writes the value in
// force again).
func (f *Feed) Proclaim(ctx context.Context, value []byte) error {
	if len(value) > heartbeat.MaxValueLen {
		return fmt.Errorf("%w: value is %d bytes, more than heartbeat.MaxValueLen (%d)", ErrInvalidConfig, len(value), heartbeat.MaxValueLen)
	}
	return f.request(ctx, request{kind: reqProclaim, ctx: ctx, value: bytes.Clone(value), settle: new(settle)})
}

func (f *Feed) request(ctx context.Context, r request) error {
	if f.opts.ObserveOnly {
		return ErrObserveOnly
	}
	f.mu.Lock()
	state, l := f.state, f.loop
	f.mu.Unlock()
	switch state {
	case stateStopped:
		return ErrClosed
	case stateNew, stateStarting:
		return ErrNotStarted
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	r.reply = make(chan error, 1)
	if !l.box.TakeHere(requestInput{r: r}) {
		return ErrClosed
	}
	select {
	case err := <-r.reply:
		return err
	case <-ctx.Done():
		// The engine bounds the write by ctx too; the reply channel is
		// buffered, so it never blocks on us. A request the engine took
		// already (a Proclaim whose value is now the node's) is answered
		// by the engine in the step that took it.
		if r.settle != nil && !r.settle.giveUp() {
			select {
			case err := <-r.reply:
				return err
			case <-f.loopDone:
				select {
				case err := <-r.reply:
					return err
				default:
					return ErrClosed
				}
			}
		}
		return ctx.Err()
	case <-f.loopDone:
		select {
		case err := <-r.reply:
			return err
		default:
			return ErrClosed
		}
	}
}

// IsLeader reports whether this node leads now: it won, has not stepped
// down, and its lease has not run out on its own monotonic clock.
func (f *Feed) IsLeader() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.snap.leader && time.Now().Before(f.leaseEnd)
}

// Term returns the fencing token of this node's current term, and whether
// it leads (as IsLeader). The term is 0 when it does not.
func (f *Feed) Term() (uint64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.snap.leader && time.Now().Before(f.leaseEnd) {
		return f.snap.term, true
	}
	return 0, false
}

// LeaderContext returns the context of this node's current term, which is
// cancelled the moment leadership ends, with the term and true; or a
// cancelled context, 0 and false when the node does not lead.
func (f *Feed) LeaderContext() (context.Context, uint64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.snap.leader && time.Now().Before(f.leaseEnd) {
		return f.snap.leaderCtx, f.snap.term, true
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx, 0, false
}

// Leader returns the last election record this node observed (Leader is ""
// when vacant), and false if it has observed none yet. The record may be
// up to a heartbeat interval old, or older while the store is unreachable;
// its Timestamp says when it was written, in the store's clock.
func (f *Feed) Leader() (heartbeat.Record, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.snap.record.Clone(), f.snap.seen
}

// Done returns a channel that is closed when the Feed has stopped and every
// goroutine it started has ended.
func (f *Feed) Done() <-chan struct{} { return f.done }

var errLeaseOver = errors.New("leaderfeed: lease ran out before the write returned")
