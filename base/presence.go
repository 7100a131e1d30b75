package base

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// Priorities of Options.Priority and Presence.Priority.
const (
	// MinPriority is the lowest priority: a node that should lead only
	// when nothing else can (a canary).
	MinPriority = -100
	// MaxPriority is the highest priority.
	MaxPriority = 100
)

// PresenceLives is how many presence intervals a presence record stays
// live without a refresh: Options.PresenceTTL defaults to PresenceLives
// times Options.PresenceInterval, so that two lost refreshes in a row do
// not drop a participant.
const PresenceLives = 3

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

// PresenceBackend is the presence capability of one election's Backend
// (those Elections gives always have it; their calls fail with an error
// matching ErrUnsupported when the Store is not a PresenceStore).
type PresenceBackend interface {
	Backend
	Present(ctx context.Context, p Presence) error
	Absent(ctx context.Context, node string) error
	Participants(ctx context.Context) ([]Presence, time.Time, error)
}

func (b *electionBackend) presenceStore() (PresenceStore, error) {
	ps, ok := b.e.store.(PresenceStore)
	if !ok {
		return nil, fmt.Errorf("leaderfeed: election %q: the store (%T) keeps no presence records (base.PresenceStore): %w", b.name, b.e.store, ErrUnsupported)
	}
	return ps, nil
}

// Present writes the presence record of p in the election.
func (b *electionBackend) Present(ctx context.Context, p Presence) error {
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
	return ps.Present(ctx, b.name, p)
}

// Absent deletes the presence record of node in the election.
func (b *electionBackend) Absent(ctx context.Context, node string) error {
	if err := b.check(ctx); err != nil {
		return err
	}
	ps, err := b.presenceStore()
	if err != nil {
		return err
	}
	return ps.Absent(ctx, b.name, node)
}

// Participants returns the presence records of the election and the
// store's time.
func (b *electionBackend) Participants(ctx context.Context) ([]Presence, time.Time, error) {
	if err := b.check(ctx); err != nil {
		return nil, time.Time{}, err
	}
	ps, err := b.presenceStore()
	if err != nil {
		return nil, time.Time{}, err
	}
	return ps.Participants(ctx, b.name)
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

// ---- the Feed's side ----

// Participants returns the live participants of the election: those whose
// presence record was refreshed within Options.PresenceTTL (this node's),
// judged by the store's own clock, highest priority first (then by node
// id). It needs a Backend with the presence capability (PresenceBackend on
// a PresenceStore); the node itself need not participate.
func (f *Feed) Participants(ctx context.Context) ([]Presence, error) {
	pb, ok := f.b.(PresenceBackend)
	if !ok {
		return nil, fmt.Errorf("leaderfeed: participants: the backend (%T) has no presence capability: %w", f.b, ErrUnsupported)
	}
	ps, now, err := pb.Participants(ctx)
	if err != nil {
		return nil, fmt.Errorf("leaderfeed: participants: %w", err)
	}
	return livePresences(ps, now, f.opts.PresenceTTL), nil
}

// livePresences keeps the presences refreshed within ttl before now, and
// sorts them by priority (highest first), then node id.
func livePresences(ps []Presence, now time.Time, ttl time.Duration) []Presence {
	var out []Presence
	for _, p := range ps {
		if now.Sub(p.Timestamp) < ttl {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b Presence) int {
		if a.Priority != b.Priority {
			return b.Priority - a.Priority
		}
		return strings.Compare(a.Node, b.Node)
	})
	return out
}

// TransferTo hands leadership to the node nodeID, in milliseconds: this
// node steps down first (its leader context is cancelled with cause
// ErrTransferred, EventUnelected with ReasonTransferred), then writes the
// vacant record reserved for nodeID (heartbeat.Record.Successor) with the
// ordinary compare-and-set. The target claims it at once; any other node
// claims it only after its election timeout, so a target that died since
// costs no more than a crashed leader.
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
// election timeout) or another node took over first (ErrConflict).
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
	i := slices.IndexFunc(live, func(p Presence) bool { return p.Node == nodeID })
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

// presence is the goroutine of a participating Feed: it refreshes the
// node's presence record every PresenceInterval and, while the node leads,
// hands leadership over to a live participant of strictly higher Priority
// that has been present for PriorityHysteresis (see Options.Priority).
// When the Feed stops it deletes the presence record (bounded by Stop's
// context).
type presence struct {
	f  *Feed
	pb PresenceBackend
	p  Presence

	// The Priority check of the leader: since when each candidate of
	// higher priority has been seen live, in the current term.
	term  uint64
	since map[string]time.Time
}

func (f *Feed) newPresence(pb PresenceBackend) *presence {
	return &presence{f: f, pb: pb, since: make(map[string]time.Time),
		p: Presence{Node: f.id, Value: f.opts.Value, Priority: f.opts.Priority, CanLead: !f.opts.ObserveOnly}}
}

// write refreshes the presence record once, bounded by the interval.
func (p *presence) write(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, p.f.opts.PresenceInterval)
	defer cancel()
	return p.pb.Present(ctx, p.p)
}

func (p *presence) run(ctx context.Context) {
	f := p.f
	t := time.NewTimer(f.opts.PresenceInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-f.stopCh:
			p.leave()
			return
		case <-ctx.Done():
			select {
			case <-f.stopCh: // Stop cancelled the engine already
				p.leave()
			default:
			}
			return
		}
		t.Reset(f.opts.PresenceInterval)
		if err := p.write(ctx); err != nil && ctx.Err() == nil {
			f.log.Debug("leaderfeed: presence refresh failed", "err", err)
		}
		p.checkPriority(ctx)
	}
}

// leave deletes the presence record when the Feed stops. It is bounded by
// Stop's context and a presence interval, not by the engine's context,
// which Stop cancels as soon as the election is handed over.
func (p *presence) leave() {
	f := p.f
	f.mu.Lock()
	sctx := f.stopCtx
	f.mu.Unlock()
	if sctx == nil {
		sctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(sctx, f.opts.PresenceInterval)
	defer cancel()
	if err := p.pb.Absent(ctx, f.id); err != nil {
		f.log.Info("leaderfeed: presence not removed (it expires)", "err", err)
	}
}

// checkPriority is the leader's Priority check: it transfers to the live
// participant of the highest priority above its own (ties: the lowest node
// id) once that one has been seen live at every check for at least
// PriorityHysteresis of the current term. Equal priorities never
// transfer, so two nodes of equal priority never hand leadership back and
// forth; a higher-priority node never takes leadership itself, it is
// handed over.
func (p *presence) checkPriority(ctx context.Context) {
	f := p.f
	term, leading := f.Term()
	if !leading {
		p.term = 0
		clear(p.since)
		return
	}
	if term != p.term {
		p.term = term
		clear(p.since)
	}
	ctx, cancel := context.WithTimeout(ctx, f.opts.PresenceInterval)
	defer cancel()
	ps, now, err := p.pb.Participants(ctx)
	if err != nil {
		f.log.Debug("leaderfeed: participants not read", "err", err)
		clear(p.since) // present continuously means seen at every check
		return
	}
	local := time.Now()
	seen := make(map[string]bool)
	var best *Presence
	for _, c := range livePresences(ps, now, f.opts.PresenceTTL) {
		if c.Node == f.id || !c.CanLead || c.Priority <= f.opts.Priority {
			continue
		}
		seen[c.Node] = true
		if _, ok := p.since[c.Node]; !ok {
			p.since[c.Node] = local
		}
		if best == nil && local.Sub(p.since[c.Node]) >= f.opts.PriorityHysteresis {
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
	f.log.Info("leaderfeed: handing over to a participant of higher priority", "to", best.Node, "priority", best.Priority, "term", term)
	if err := f.transfer(ctx, best.Node); err != nil {
		f.log.Info("leaderfeed: priority handover failed", "to", best.Node, "err", err)
	}
	clear(p.since)
}
