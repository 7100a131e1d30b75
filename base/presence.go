package base

import (
	"context"
	"errors"
	"fmt"
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
		return nil, fmt.Errorf("leaderfeed: election %q: the store (%T) keeps no presence records (base.PresenceStore): %w", b.name, b.e.store, backend.ErrUnsupported)
	}
	return ps, nil
}

// Present writes the presence record of p in the election.
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
func (b *electionBackend) Participants(ctx context.Context) ([]backend.Presence, time.Time, error) {
	if err := b.check(ctx); err != nil {
		return nil, time.Time{}, err
	}
	ps, err := b.presenceStore()
	if err != nil {
		return nil, time.Time{}, err
	}
	return ps.Participants(ctx, b.name)
}

// ---- the Feed's side ----

// Participants returns the live participants of the election: those whose
// presence record was refreshed within Options.PresenceTTL (this node's),
// judged by the store's own clock, highest priority first (then by node
// id). It needs a Backend with the presence capability (PresenceBackend on
// a PresenceStore); the node itself need not participate.
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
// sorts them by priority (highest first), then node id.
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

// presence is the goroutine of a participating Feed: it refreshes the
// node's presence record every PresenceInterval and, while the node leads,
// hands leadership over to a live participant of strictly higher Priority
// that has been present for PriorityHysteresis (see Options.Priority).
// When the Feed stops it deletes the presence record (bounded by Stop's
// context).
type presence struct {
	f  *Feed
	pb backend.PresenceElection
	p  backend.Presence

	// The Priority check of the leader: since when each candidate of
	// higher priority has been seen live, in the current term.
	term  uint64
	since map[string]time.Time
}

func (f *Feed) newPresence(pb backend.PresenceElection) *presence {
	return &presence{f: f, pb: pb, since: make(map[string]time.Time),
		p: backend.Presence{Node: f.id, Value: f.opts.Value, Priority: f.opts.Priority, CanLead: !f.opts.ObserveOnly}}
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
	var best *backend.Presence
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
