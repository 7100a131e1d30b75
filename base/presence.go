package base

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// Priorities of Options.Priority and backend.Presence.Priority.
const (
	// MinPriority is the lowest priority: a node that should lead only
	// when nothing else can (a canary).
	MinPriority = backend.MinPriority
	// MaxPriority is the highest priority.
	MaxPriority = backend.MaxPriority
)

// presenceLives is how many presence intervals a presence record stays
// live without a refresh: Options.PresenceTTL defaults to presenceLives
// times Options.PresenceInterval, so that two lost refreshes in a row do
// not drop a participant.
const presenceLives = 3

func (b *electionBackend) presenceStore() (backend.PresenceStore, error) {
	ps, ok := b.e.store.(backend.PresenceStore)
	if !ok {
		return nil, fmt.Errorf("leaderfeed: election %q: the store (%T) keeps no presence records (backend.PresenceStore): %w", b.name, b.e.store, backend.ErrUnsupported)
	}
	return ps, nil
}

// Present writes the presence record of p in the election: in a batch
// with those of other elections when the Store can (presenceBatch).
func (b *electionBackend) Present(ctx context.Context, p backend.Presence) error {
	if err := b.check(ctx); err != nil {
		return err
	}
	ps, err := b.presenceStore()
	if err != nil {
		return err
	}
	if err := p.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if b.e.pres != nil {
		return b.e.pres.present(ctx, b.name, p)
	}
	return ps.Present(ctx, b.name, p)
}

// Absent deletes the presence record of node in the election, once no
// batch in flight writes it.
func (b *electionBackend) Absent(ctx context.Context, node string) error {
	if err := b.check(ctx); err != nil {
		return err
	}
	ps, err := b.presenceStore()
	if err != nil {
		return err
	}
	if b.e.pres != nil {
		if err := b.e.pres.settle(ctx, b.name, node); err != nil {
			return err
		}
	}
	return ps.Absent(ctx, b.name, node)
}

// Participants returns the presence records of the election and the
// store's time, read in a batch with other elections' when the Store can.
func (b *electionBackend) Participants(ctx context.Context) ([]backend.Presence, time.Time, error) {
	if err := b.check(ctx); err != nil {
		return nil, time.Time{}, err
	}
	ps, err := b.presenceStore()
	if err != nil {
		return nil, time.Time{}, err
	}
	if b.e.pres != nil {
		return b.e.pres.participants(ctx, b.name)
	}
	return ps.Participants(ctx, b.name)
}

// HeartbeatGuarded is the guarded write (backend.GuardElection): never
// batched, since a handover waits for it alone. It fails with an error
// matching ErrUnsupported, without I/O, when the Store is not a
// backend.GuardStore.
func (b *electionBackend) HeartbeatGuarded(ctx context.Context, expected, next heartbeat.Record, guard backend.Guard) (heartbeat.Record, error) {
	if err := b.writable(ctx, &next); err != nil {
		return heartbeat.Record{}, err
	}
	gs, ok := b.e.store.(backend.GuardStore)
	if !ok {
		return heartbeat.Record{}, fmt.Errorf("leaderfeed: election %q: the store (%T) has no guarded write (backend.GuardStore): %w", b.name, b.e.store, backend.ErrUnsupported)
	}
	return gs.HeartbeatGuarded(ctx, expected, next, guard)
}

// ---- the Feed's side ----

// Participants returns the live participants of the election: those whose
// presence record was refreshed within Options.PresenceTTL (this node's),
// judged by the store's own clock, in the order a leader picks its
// successor: highest priority first, then the one that joined most
// recently (backend.Presence.Joined: the new nodes of a rolling restart
// before the old ones stopped next), then by node id. It needs a Backend
// with the presence capability (PresenceBackend on a PresenceStore); the
// node itself need not participate.
func (f *Feed) Participants(ctx context.Context) ([]backend.Presence, error) {
	pb, ok := f.b.(backend.PresenceElection)
	if !ok {
		return nil, fmt.Errorf("leaderfeed: participants: the backend (%T) has no presence capability: %w", f.b, backend.ErrUnsupported)
	}
	ps, now, err := pb.Participants(ctx)
	if err != nil {
		return nil, fmt.Errorf("leaderfeed: participants: %w", err)
	}
	return livePresences(ps, now, f.opts.PresenceTTL), nil
}

// livePresences keeps the presences refreshed within ttl before now, and
// sorts them by priority (highest first), then Joined (most recent
// first), then node id.
func livePresences(ps []backend.Presence, now time.Time, ttl time.Duration) []backend.Presence {
	var out []backend.Presence
	for _, p := range ps {
		if now.Sub(p.Timestamp) < ttl {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b backend.Presence) int {
		if a.Priority != b.Priority {
			return b.Priority - a.Priority
		}
		if c := b.Joined.Compare(a.Joined); c != 0 {
			return c
		}
		return strings.Compare(a.Node, b.Node)
	})
	return out
}

// TransferTo hands leadership to the node nodeID, in milliseconds: this
// node steps down first (its leader context is cancelled with cause
// ErrTransferred, EventUnelected with ReasonTransferred), then writes,
// with the ordinary compare-and-set, the record that hands the election
// to nodeID (see Resign) when its last read of the participants (within
// two presence intervals) holds a token of nodeID, else the vacant record reserved for nodeID
// (heartbeat.Record.Successor), which the target claims at once. Any other
// node claims either only after its election timeout, so a target that
// died since costs no more than a crashed leader.
//
// The target must be a live participant that can lead (Participants).
// Bad input leaves the leader leading and fails with an error matching:
// ErrNotLeader (this node does not lead), ErrTransferToSelf,
// ErrNotStarted or ErrClosed (the Feed is not running),
// ErrUnknownParticipant (not a live participant), ErrTargetCannotLead (an
// observe-only participant), ErrObserveOnly (this node observes),
// ErrInvalidConfig (not a valid node id), or ErrUnsupported (the backend
// keeps no presence records). Once the node stepped down, an error says the
// reserved vacancy was not written (the others then take over after their
// election timeout), another node took over first (ErrConflict), or the
// target withdrew before the write, which a store with the guarded write
// (backend.GuardStore) refuses, and the election went to the next
// participant instead (ErrUnknownParticipant).
func (f *Feed) TransferTo(ctx context.Context, nodeID string) error {
	if f.opts.ObserveOnly {
		return ErrObserveOnly
	}
	if err := heartbeat.ValidateName("transfer target", nodeID); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if nodeID == f.id {
		return fmt.Errorf("leaderfeed: transfer to %q: %w", nodeID, ErrTransferToSelf)
	}
	f.mu.Lock()
	state := f.state
	f.mu.Unlock()
	switch state {
	case stateStopped:
		return ErrClosed
	case stateNew, stateStarting:
		return ErrNotStarted
	}
	if !f.IsLeader() {
		return fmt.Errorf("leaderfeed: transfer to %q: %w", nodeID, ErrNotLeader)
	}
	live, err := f.Participants(ctx)
	if err != nil {
		return fmt.Errorf("leaderfeed: transfer to %q: %w", nodeID, err)
	}
	i := slices.IndexFunc(live, func(p backend.Presence) bool { return p.Node == nodeID })
	switch {
	case i < 0:
		return fmt.Errorf("leaderfeed: transfer to %q: %w", nodeID, ErrUnknownParticipant)
	case !live[i].CanLead:
		return fmt.Errorf("leaderfeed: transfer to %q: %w", nodeID, ErrTargetCannotLead)
	}
	return f.transfer(ctx, nodeID)
}

func (f *Feed) transfer(ctx context.Context, nodeID string) error {
	err := f.request(ctx, request{kind: reqTransfer, ctx: ctx, target: nodeID})
	if errors.Is(err, ErrNotLeader) || errors.Is(err, ErrTransferToSelf) {
		return fmt.Errorf("leaderfeed: transfer to %q: %w", nodeID, err)
	}
	return err
}

// presence is what the loop of a participating Feed needs for its
// presence calls: the backend and the record it writes.
type presence struct {
	pb backend.PresenceElection
	p  backend.Presence
	// started: the tokens of Start's presence writes, each with the
	// instant it was sent, for the machine (priorityCheck.sent).
	started []sentToken
}

func (f *Feed) newPresence(pb backend.PresenceElection, inc uint64) *presence {
	return &presence{pb: pb, p: backend.Presence{Node: f.id, Value: f.opts.Value, Priority: f.opts.Priority, CanLead: !f.opts.ObserveOnly, Incarnation: inc}}
}

// write writes the presence record once with token and value, bounded by
// timeout.
func (p *presence) write(ctx context.Context, timeout time.Duration, token uint64, value []byte) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	rec := p.p
	rec.Token, rec.Value = token, value
	return p.pb.Present(ctx, rec)
}

// ---- the machine's side ----

// Presence is an input and effect of the machine like any store call: the
// presence timer (timerPresence) fires every PresenceInterval; the machine
// asks for a refresh of the presence record (presenceCall), and while it
// leads for a read of the participants along with it; the result comes back
// as a presenceResult, on which the machine runs the Priority check. Stop
// deletes the presence record (leavePresence).

// presenceCall refreshes the node's presence record with token off the
// engine's goroutine and, if check, reads the participants; the result
// comes back as a presenceResult carrying term and check. value is the
// node's value now (Options.Value, or what a successful Proclaim made it):
// a handover to this node publishes it.
type presenceCall struct {
	term  uint64
	check bool
	token uint64
	value []byte
}

// leavePresence deletes the node's presence record, bounded by ctx and a
// presence interval. Feed.done waits for it.
type leavePresence struct {
	ctx  context.Context
	tell bool // answer with a leftInput once done
}

// leftInput: the delete of a leavePresence that tells is done.
type leftInput struct{}

func (leftInput) isInput() {}

// handoverView reads the participants for a handover, bounded by ctx and
// a presence interval, after deleting the node's presence record if leave
// (as leavePresence does); the result comes back as a handoverViewResult.
type handoverView struct {
	ctx   context.Context
	leave bool
}

func (presenceCall) isEffect()  {}
func (leavePresence) isEffect() {}
func (handoverView) isEffect()  {}

// handoverViewResult is the outcome of a handoverView: the participants
// and the store's time, or the read's error.
type handoverViewResult struct {
	ps       []backend.Presence
	storeNow time.Time
	err      error
}

func (handoverViewResult) isInput() {}

// presenceResult is the outcome of a presenceCall: the refresh's error,
// and (if check) the participants read and the store's time, or the
// read's error.
type presenceResult struct {
	term     uint64
	check    bool
	writeErr error
	ps       []backend.Presence
	storeNow time.Time
	readErr  error
}

func (presenceResult) isInput() {}

// priorityCheck is the machine's state for presence: nil when the node
// does not participate.
type priorityCheck struct {
	interval, ttl, hysteresis time.Duration
	priority                  int
	busy                      bool // a presenceCall is in flight

	// Since when each candidate of higher priority has been seen live, in
	// term (0: not leading).
	term  uint64
	since map[string]time.Time

	// The tokens of this node's last presence writes and when each was
	// sent (a handover names one: case 5 of the safety argument), newest
	// at sent[next-1].
	sent [presenceTokens]sentToken
	next int

	// The live participants of the leader's last read, in the order
	// livePresences gives, when its result came in (zero: none yet), and
	// the store's time it gave.
	live    []backend.Presence
	readAt  time.Time
	storeAt time.Time
}

// presenceTokens is how many presence writes a node remembers the token
// of. A leader hands over with a token at most two presence intervals old
// (successor), which is at most the third-newest of the successor's.
const presenceTokens = 8

type sentToken struct {
	token  uint64
	sentAt time.Time
}

func newPriorityCheck(opts Options) *priorityCheck {
	if !opts.Participate {
		return nil
	}
	return &priorityCheck{interval: opts.PresenceInterval, ttl: opts.PresenceTTL, hysteresis: opts.PriorityHysteresis,
		priority: opts.Priority, since: make(map[string]time.Time)}
}

func (m *machine) onPresenceTimer() {
	p := m.pres
	if m.role == roleStopping {
		return
	}
	m.setTimer(timerPresence, m.now.Add(p.interval))
	if p.busy {
		return
	}
	p.busy = true
	token := drawIdentity()
	p.sent[p.next] = sentToken{token: token, sentAt: m.now}
	p.next = (p.next + 1) % presenceTokens
	m.do(presenceCall{term: m.term, check: m.role == roleLeader, token: token, value: m.value})
}

// tokenSent returns when this node sent the presence write of token, if it
// is one of the last presenceTokens it drew.
func (p *priorityCheck) tokenSent(token uint64) (time.Time, bool) {
	for _, s := range p.sent {
		if s.token == token && token != 0 {
			return s.sentAt, true
		}
	}
	return time.Time{}, false
}

// successor returns whom a leader hands the election to when it gives it
// up: the first live participant in the order of livePresences (priority,
// then the one that joined last, then node id) that can lead and wrote a
// token (node, when given), as the leader read them at most two presence
// intervals ago (only leaders read; Stop reads at once, handOver, and so
// does Resign unless that read serves, fromView). to, when set, is that
// participant, handed the election in one write
// (heartbeat.Record.Handover): its presence write with that token is
// young enough for its lease on the handover to run when the handover
// reaches it (oneWriteAge). Otherwise reserve names it, for the vacancy
// reserved for it, which it claims at once: one more write, but never a
// handover its successor cannot take (a skipped term, two new leaders for
// one change). Neither is set when there is no such participant or no
// recent read: the vacancy is for whoever claims first. Any choice is
// safe; the freshness is for the successor's lease.
func (m *machine) successor(node string) (to, reserve backend.Presence) {
	p := m.pres
	if p == nil || p.readAt.IsZero() || m.now.Sub(p.readAt) > 2*p.interval {
		return backend.Presence{}, backend.Presence{}
	}
	for _, c := range p.live {
		if c.Node == m.id || !c.CanLead || c.Token == 0 || (node != "" && c.Node != node) {
			continue // no token: a participant of an older version
		}
		// The token's age now: at the read by the store's clock, then
		// since by this node's (their rates are about the same).
		age := p.storeAt.Sub(c.Timestamp) + m.now.Sub(p.readAt)
		if age <= m.oneWriteAge() {
			return c, backend.Presence{}
		}
		return backend.Presence{}, c
	}
	return backend.Presence{}, backend.Presence{}
}

// oneWriteAge is the age a successor's presence write may have when the
// leader hands over in one write: half of LeaseDuration, so that half of
// the successor's lease is left for the write, its notification and the
// successor's scheduling (with a quarter left, handovers on a loaded
// machine reached their successor after its lease, which then claimed
// the next term: a skipped term). The leader reads the participants as it
// hands over, so with a default PresenceInterval (a quarter of the lease)
// a live participant's token is at most about an interval old, well
// within it; an older one gets the reserved vacancy, never a skipped term.
func (m *machine) oneWriteAge() time.Duration { return m.t.LeaseDuration / 2 }

// onPresence is the leader's Priority check: it transfers to the live
// participant of the highest priority above its own (ties: the lowest node
// id) once that one has been seen live at every check for at least
// PriorityHysteresis of the current term. Equal priorities never transfer,
// so two nodes of equal priority never hand leadership back and forth; a
// higher-priority node never takes leadership itself, it is handed over.
func (m *machine) onPresence(r presenceResult) {
	p := m.pres
	p.busy = false
	if m.role != roleStopping {
		// A presence write is a write to the table of the records: it
		// shows whether the store takes this node's writes, which a
		// follower otherwise learns only from its rare claims.
		m.noteRefusal(refusedWrites, r.writeErr, r.writeErr == nil)
		if r.writeErr != nil {
			m.debug("leaderfeed: presence refresh failed", "err", r.writeErr)
		}
	}
	if m.role != roleLeader || !r.check || r.term != m.term {
		if m.role != roleLeader {
			p.term = 0
			clear(p.since)
		}
		return
	}
	if p.term != m.term {
		p.term = m.term
		clear(p.since)
	}
	if r.readErr != nil {
		m.debug("leaderfeed: participants not read", "err", r.readErr)
		clear(p.since) // present continuously means seen at every check
		return
	}
	p.live, p.readAt, p.storeAt = livePresences(r.ps, r.storeNow, p.ttl), m.now, r.storeNow
	seen := make(map[string]bool)
	var best *backend.Presence
	for _, c := range p.live {
		if c.Node == m.id || !c.CanLead || c.Priority <= p.priority {
			continue
		}
		seen[c.Node] = true
		if _, ok := p.since[c.Node]; !ok {
			p.since[c.Node] = m.now
		}
		if best == nil && m.now.Sub(p.since[c.Node]) >= p.hysteresis {
			best = &c
		}
	}
	for n := range p.since {
		if !seen[n] {
			delete(p.since, n)
		}
	}
	if best == nil {
		return
	}
	clear(p.since)
	m.do(logLine{level: slog.LevelInfo, msg: "leaderfeed: handing over to a participant of higher priority", args: []any{"to", best.Node, "priority", best.Priority, "term", m.term}})
	m.transfer(best.Node, &vacancyWrite{timeout: p.interval})
}

// ---- the loop's side ----

// presenceCall executes a presenceCall on a goroutine of its own, each
// store call bounded by a presence interval.
func (l *loop) presenceCall(eff effect) {
	c := eff.(presenceCall)
	done := make(chan struct{})
	l.presDone = done
	l.f.goroutineStarts()
	go func() {
		defer l.f.goroutineEnds()
		defer close(done)
		r := presenceResult{term: c.term, check: c.check}
		r.writeErr = l.pres.write(l.presCtx, l.f.opts.PresenceInterval, c.token, c.value)
		if c.check {
			ctx, cancel := context.WithTimeout(l.ctx, l.f.opts.PresenceInterval)
			r.ps, r.storeNow, r.readErr = l.pres.pb.Participants(ctx)
			cancel()
		}
		l.box.PutHere(r)
	}()
}

// leavePresence deletes the presence record when the Feed stops, bounded
// by Stop's context and a presence interval, not by the engine's context,
// which Stop cancels as soon as the election is handed over. It waits for
// a presence write in flight (itself bounded by a presence interval):
// one that committed after the delete would list the stopped node as a
// live participant, and a successor, until its record expired.
func (l *loop) leavePresence(eff effect) {
	e := eff.(leavePresence)
	inFlight := l.presDone
	l.f.goroutineStarts()
	go func() {
		defer l.f.goroutineEnds()
		l.leave(e.ctx, inFlight)
		if e.tell {
			l.box.PutHere(leftInput{})
		}
	}()
}

// leave deletes the presence record once the presence call in flight
// (inFlight closed) ended.
func (l *loop) leave(sctx context.Context, inFlight <-chan struct{}) {
	if inFlight != nil {
		select {
		case <-inFlight:
		case <-sctx.Done(): // Absent fails at once, and says so
		}
	}
	ctx, cancel := context.WithTimeout(sctx, l.f.opts.PresenceInterval)
	defer cancel()
	if err := l.pres.pb.Absent(ctx, l.f.id); err != nil {
		l.f.log.Info("leaderfeed: presence not removed (it expires)", "err", err)
	}
}

// handoverView executes a handoverView: the delete (leave), then the
// read, so that the handover written after it never commits before this
// node's withdrawal. One after the other, not side by side: two calls at
// once need two of the store's connections at the moment of the
// handover, and a client pool that holds one opens another then (on
// PostgreSQL 5-10 ms, the rollout's whole gap), where the second round
// trip costs well under a millisecond.
func (l *loop) handoverView(eff effect) {
	c := eff.(handoverView)
	sctx := c.ctx
	if sctx == nil {
		sctx = l.ctx
	}
	inFlight := l.presDone
	l.f.goroutineStarts()
	go func() {
		defer l.f.goroutineEnds()
		if c.leave {
			l.leave(sctx, inFlight)
		}
		// The handover waits for this read: it waits for no batch. It
		// ends with the engine as well: Resign's context may have no
		// deadline, and Stop waits for this goroutine.
		ctx, cancel := context.WithTimeout(urgent(sctx), l.f.opts.PresenceInterval)
		stop := context.AfterFunc(l.ctx, cancel)
		var r handoverViewResult
		r.ps, r.storeNow, r.err = l.pres.pb.Participants(ctx)
		stop()
		cancel()
		l.box.PutHere(r)
	}()
}
