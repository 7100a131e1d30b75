// Package faulty wraps a base.Backend to inject faults: failed, delayed or
// hung calls, replies lost after the write went through, broken feeds and
// partitions. The conformance suite (base/basetest) and the examples use it;
// it imports no testing package, so a program may use it too, for example to
// show a failover.
package faulty

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// ErrInjected is the error Backend returns for an injected failure, unless
// the Fault names another.
var ErrInjected = errors.New("faulty: injected fault")

// Method names a Backend method for fault injection.
type Method string

// The methods of base.Backend that faults can be injected into.
const (
	MethodStart     Method = "Start"
	MethodCreate    Method = "Create"
	MethodGet       Method = "Get"
	MethodHeartbeat Method = "Heartbeat"
	MethodSubscribe Method = "Subscribe"
	// The presence capability (base.PresenceBackend): Present, Absent and
	// Participants. A wrapped backend without it fails them with
	// base.ErrUnsupported.
	MethodPresent      Method = "Present"
	MethodAbsent       Method = "Absent"
	MethodParticipants Method = "Participants"
)

// Fault is a failure injected into calls of one method.
type Fault struct {
	Method Method
	// Nth is the call it hits, counted from the Inject call: 1 is the next
	// call. 0 hits every call until Heal.
	Nth int
	// Err is returned instead of calling the backend (ErrInjected if nil
	// and neither Delay nor Hang is set).
	Err error
	// Delay holds the call back this long before it goes through (or fails
	// with Err, if set). The caller's context still ends it.
	Delay time.Duration
	// Hang blocks the call until its context ends.
	Hang bool
	// After makes the backend call first and then return Err: the write
	// happened but the caller is told it failed.
	After bool
}

// Backend wraps a Backend and injects faults: failed, delayed or hung calls,
// broken feeds, and a full partition. It is safe for concurrent use.
type Backend struct {
	base.Backend

	mu          sync.Mutex
	calls       map[Method]int
	faults      []activeFault
	partitioned bool
	subs        map[*faultySub]struct{}
	writes      []base.Write // every Heartbeat call, up to maxWriteLog
}

// maxWriteLog bounds the calls Writes keeps.
const maxWriteLog = 100000

// Writes returns the arguments of every Heartbeat call so far (the first
// 100,000), in call order, whether or not a fault hit it.
func (f *Backend) Writes() []base.Write {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]base.Write(nil), f.writes...)
}

type activeFault struct {
	Fault
	call int // absolute call number, or 0 for every call
}

// Wrap returns b wrapped in a Backend that injects nothing until told to.
func Wrap(b base.Backend) *Backend {
	return &Backend{Backend: b, calls: make(map[Method]int), subs: make(map[*faultySub]struct{})}
}

// Inject adds a fault.
func (f *Backend) Inject(ft Fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	af := activeFault{Fault: ft}
	if ft.Nth > 0 {
		af.call = f.calls[ft.Method] + ft.Nth
	}
	f.faults = append(f.faults, af)
}

// Calls returns how many calls of m the wrapper has seen.
func (f *Backend) Calls(m Method) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[m]
}

// BreakFeed ends every open subscription with a Failed notification
// carrying err (ErrInjected if nil). Later subscriptions work.
func (f *Backend) BreakFeed(err error) {
	if err == nil {
		err = ErrInjected
	}
	f.mu.Lock()
	subs := make([]*faultySub, 0, len(f.subs))
	for s := range f.subs {
		subs = append(subs, s)
	}
	f.mu.Unlock()
	for _, s := range subs {
		s.breakWith(err)
	}
}

// Partition cuts the backend off: every call fails with ErrInjected and
// open subscriptions break, until Heal. It is how the suite simulates a
// crashed or isolated node, which can neither renew nor resign.
func (f *Backend) Partition() {
	f.mu.Lock()
	f.partitioned = true
	f.mu.Unlock()
	f.BreakFeed(fmt.Errorf("%w: partitioned", ErrInjected))
}

// Heal removes every fault and ends a partition.
func (f *Backend) Heal() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.faults = nil
	f.partitioned = false
}

// before runs the faults that hit this call of m. It returns the error to
// return, and whether to make the real call before returning it.
func (f *Backend) before(ctx context.Context, m Method) (bool, error) {
	f.mu.Lock()
	f.calls[m]++
	n := f.calls[m]
	if f.partitioned {
		f.mu.Unlock()
		return false, fmt.Errorf("%w: partitioned", ErrInjected)
	}
	var hit []Fault
	kept := f.faults[:0]
	for _, af := range f.faults {
		switch {
		case af.Method != m:
			kept = append(kept, af)
		case af.call == 0:
			hit = append(hit, af.Fault)
			kept = append(kept, af)
		case af.call == n:
			hit = append(hit, af.Fault)
		default:
			kept = append(kept, af)
		}
	}
	f.faults = kept
	f.mu.Unlock()
	for _, ft := range hit {
		if ft.Hang {
			<-ctx.Done()
			return false, ctx.Err()
		}
		if ft.Delay > 0 {
			t := time.NewTimer(ft.Delay)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return false, ctx.Err()
			}
		}
		if ft.Err != nil || ft.Delay == 0 {
			err := ft.Err
			if err == nil {
				err = ErrInjected
			}
			return ft.After, err
		}
	}
	return false, nil
}

// Start injects faults into Backend.Start.
func (f *Backend) Start(ctx context.Context) error {
	if after, err := f.before(ctx, MethodStart); err != nil {
		if after {
			_ = f.Backend.Start(ctx)
		}
		return err
	}
	return f.Backend.Start(ctx)
}

// Create injects faults into Backend.Create.
func (f *Backend) Create(ctx context.Context) error {
	if after, err := f.before(ctx, MethodCreate); err != nil {
		if after {
			_ = f.Backend.Create(ctx)
		}
		return err
	}
	return f.Backend.Create(ctx)
}

// Get injects faults into Backend.Get.
func (f *Backend) Get(ctx context.Context) (heartbeat.Record, error) {
	if after, err := f.before(ctx, MethodGet); err != nil {
		if after {
			_, _ = f.Backend.Get(ctx)
		}
		return heartbeat.Record{}, err
	}
	return f.Backend.Get(ctx)
}

// Heartbeat injects faults into Backend.Heartbeat. With Fault.After the
// write is made and its result thrown away, as when a reply is lost.
func (f *Backend) Heartbeat(ctx context.Context, expected, next heartbeat.Record) (heartbeat.Record, error) {
	f.mu.Lock()
	if len(f.writes) < maxWriteLog {
		f.writes = append(f.writes, base.Write{Expected: expected.Clone(), Next: next.Clone()})
	}
	f.mu.Unlock()
	if after, err := f.before(ctx, MethodHeartbeat); err != nil {
		if after {
			_, _ = f.Backend.Heartbeat(ctx, expected, next)
		}
		return heartbeat.Record{}, err
	}
	return f.Backend.Heartbeat(ctx, expected, next)
}

// Subscribe injects faults into Backend.Subscribe and wraps the feed so
// that BreakFeed and Partition can break it.
func (f *Backend) Subscribe(ctx context.Context) (<-chan base.Notification, error) {
	if _, err := f.before(ctx, MethodSubscribe); err != nil {
		return nil, err
	}
	innerCtx, cancel := context.WithCancel(ctx)
	in, err := f.Backend.Subscribe(innerCtx)
	if err != nil {
		cancel()
		return nil, err
	}
	s := &faultySub{out: make(chan base.Notification), broken: make(chan error, 1)}
	f.mu.Lock()
	f.subs[s] = struct{}{}
	f.mu.Unlock()
	go func() {
		defer func() {
			f.mu.Lock()
			delete(f.subs, s)
			f.mu.Unlock()
		}()
		s.forward(ctx, in, cancel)
	}()
	return s.out, nil
}

type faultySub struct {
	out    chan base.Notification
	broken chan error
}

func (s *faultySub) breakWith(err error) {
	select {
	case s.broken <- err:
	default:
	}
}

// forward copies in to out until ctx ends, in closes, or the sub is broken;
// then it cancels and drains in, and closes out.
func (s *faultySub) forward(ctx context.Context, in <-chan base.Notification, cancel context.CancelFunc) {
	defer close(s.out)
	defer func() {
		cancel()
		for range in {
		}
	}()
	for {
		select {
		case n, ok := <-in:
			if !ok {
				return
			}
			select {
			case s.out <- n:
			case <-ctx.Done():
				return
			case err := <-s.broken:
				s.fail(ctx, err)
				return
			}
			if n.Type == base.Failed {
				return
			}
		case err := <-s.broken:
			s.fail(ctx, err)
			return
		case <-ctx.Done():
			return
		}
	}
}

func (s *faultySub) fail(ctx context.Context, err error) {
	select {
	case s.out <- base.Notification{Type: base.Failed, Err: err}:
	case <-ctx.Done():
	}
}

var _ base.PresenceBackend = (*Backend)(nil)

func (f *Backend) presence() (base.PresenceBackend, error) {
	pb, ok := f.Backend.(base.PresenceBackend)
	if !ok {
		return nil, fmt.Errorf("faulty: the wrapped backend (%T) has no presence capability: %w", f.Backend, base.ErrUnsupported)
	}
	return pb, nil
}

// Present injects faults into the wrapped backend's Present.
func (f *Backend) Present(ctx context.Context, p base.Presence) error {
	pb, err := f.presence()
	if err != nil {
		return err
	}
	if after, err := f.before(ctx, MethodPresent); err != nil {
		if after {
			_ = pb.Present(ctx, p)
		}
		return err
	}
	return pb.Present(ctx, p)
}

// Absent injects faults into the wrapped backend's Absent.
func (f *Backend) Absent(ctx context.Context, node string) error {
	pb, err := f.presence()
	if err != nil {
		return err
	}
	if after, err := f.before(ctx, MethodAbsent); err != nil {
		if after {
			_ = pb.Absent(ctx, node)
		}
		return err
	}
	return pb.Absent(ctx, node)
}

// Participants injects faults into the wrapped backend's Participants.
func (f *Backend) Participants(ctx context.Context) ([]base.Presence, time.Time, error) {
	pb, err := f.presence()
	if err != nil {
		return nil, time.Time{}, err
	}
	if _, err := f.before(ctx, MethodParticipants); err != nil {
		return nil, time.Time{}, err
	}
	return pb.Participants(ctx)
}
