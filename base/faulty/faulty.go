// Package faulty wraps a backend.Election to inject faults: failed, delayed or
// hung calls, replies lost after the write went through, broken feeds and
// partitions. The conformance suite (base/basetest) and the examples use it;
// it imports no testing package, so a program may use it too, for example to
// show a failover.
package faulty

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// ErrInjected is the error Backend returns for an injected failure, unless
// the Fault names another.
var ErrInjected = errors.New("faulty: injected fault")

// Method names a Backend method for fault injection.
type Method string

// The methods of backend.Election that faults can be injected into.
const (
	MethodStart     Method = "Start"
	MethodCreate    Method = "Create"
	MethodGet       Method = "Get"
	MethodHeartbeat Method = "Heartbeat"
	MethodSubscribe Method = "Subscribe"
	// The presence capability (backend.PresenceElection): Present, Absent and
	// Participants. A wrapped backend without it fails them with
	// backend.ErrUnsupported.
	MethodPresent      Method = "Present"
	MethodAbsent       Method = "Absent"
	MethodParticipants Method = "Participants"
	// The guarded write (backend.GuardElection, backend.GuardStore); a
	// wrapped backend or store without it fails it with
	// backend.ErrUnsupported. Its writes are logged with the others'.
	MethodHeartbeatGuarded Method = "HeartbeatGuarded"
	// The batch capabilities of a Store (backend.BatchStore, backend.BatchReader).
	MethodHeartbeatBatch Method = "HeartbeatBatch"
	MethodGetBatch       Method = "GetBatch"
	// The presence batch capability of a Store (backend.PresenceBatchStore).
	MethodPresentBatch      Method = "PresentBatch"
	MethodParticipantsBatch Method = "ParticipantsBatch"
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
	// Late, with Delay, makes a call that the caller gives up on go
	// through all the same once Delay has passed, as a request already on
	// its way to the server does: the caller gets its context's error, the
	// store gets the call. Start, Create, Present and Absent only.
	Late bool
	// After makes the backend call first and then return Err: the write
	// happened but the caller is told it failed.
	After bool
	// DelayReply lets the call go through and holds its reply back this
	// long (the caller's context still ends the wait): a reply that comes
	// late.
	DelayReply time.Duration
	// Election, when set, limits the fault to calls about that election
	// (a Store's calls name it; a Backend's are all of its one election),
	// and Nth counts only those. In a HeartbeatBatch or PresentBatch of a
	// Store, Err and After then hit that election's writes alone: their
	// result is Err (with After, after the batch made the write: one reply
	// lost inside a batch); Delay, DelayReply and Hang hold back the whole
	// batch.
	Election string
}

// injector is the fault state Backend and Store share: the faults in
// force, the calls counted, the partition, the open feeds and the log of
// writes.
type injector struct {
	mu          sync.Mutex
	calls       map[Method]int
	faults      []activeFault
	partitioned bool
	subs        map[breakable]struct{}
	writes      []backend.Write // every write, up to maxWriteLog
}

func newInjector() *injector {
	return &injector{calls: make(map[Method]int), subs: make(map[breakable]struct{})}
}

// Backend wraps an Election and injects faults: failed, delayed or hung
// calls, broken feeds, and a full partition. It forwards every capability
// of the contract (presence, the renewal grid, submitted writes, feeds
// handed to a function). It is safe for concurrent use.
type Backend struct {
	inner backend.Election
	in    *injector
}

// Name returns the wrapped Election's name.
func (f *Backend) Name() string { return f.inner.Name() }

// Unwrap returns the wrapped Election, for calls that must bypass the
// faults.
func (f *Backend) Unwrap() backend.Election { return f.inner }

// Close closes the wrapped Election.
func (f *Backend) Close() error { return f.inner.Close() }

// maxWriteLog bounds the writes Writes keeps.
const maxWriteLog = 100000

// Writes returns the arguments of every Heartbeat call so far (the first
// 100,000), in call order, whether or not a fault hit it.
func (f *Backend) Writes() []backend.Write { return f.in.writeLog() }

func (in *injector) writeLog() []backend.Write {
	in.mu.Lock()
	defer in.mu.Unlock()
	return append([]backend.Write(nil), in.writes...)
}

func (in *injector) logWrite(w backend.Write) {
	in.mu.Lock()
	if len(in.writes) < maxWriteLog {
		in.writes = append(in.writes, backend.Write{Expected: w.Expected.Clone(), Next: w.Next.Clone()})
	}
	in.mu.Unlock()
}

type activeFault struct {
	Fault
	call int // absolute call number (of its method and election), or 0 for every call
}

// countKey is what Nth counts: calls of a method, or of a method about
// one election.
func countKey(m Method, election string) Method {
	if election == "" {
		return m
	}
	return m + "/" + Method(election)
}

// Wrap returns b wrapped in a Backend that injects nothing until told to.
func Wrap(b backend.Election) *Backend {
	return &Backend{inner: b, in: newInjector()}
}

// Inject adds a fault.
func (f *Backend) Inject(ft Fault) { f.in.inject(ft) }

func (in *injector) inject(ft Fault) {
	in.mu.Lock()
	defer in.mu.Unlock()
	af := activeFault{Fault: ft}
	if ft.Nth > 0 {
		af.call = in.calls[countKey(ft.Method, ft.Election)] + ft.Nth
	}
	in.faults = append(in.faults, af)
}

// Calls returns how many calls of m the wrapper has seen.
func (f *Backend) Calls(m Method) int { return f.in.count(m) }

func (in *injector) count(m Method) int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.calls[m]
}

// BreakFeed ends every open subscription with a Failed notification
// carrying err (ErrInjected if nil). Later subscriptions work.
func (f *Backend) BreakFeed(err error) { f.in.breakFeeds(err) }

func (in *injector) breakFeeds(err error) {
	if err == nil {
		err = ErrInjected
	}
	in.mu.Lock()
	subs := make([]breakable, 0, len(in.subs))
	for s := range in.subs {
		subs = append(subs, s)
	}
	in.mu.Unlock()
	for _, s := range subs {
		s.breakWith(err)
	}
}

// Partition cuts the backend off: every call fails with ErrInjected and
// open subscriptions break, until Heal. It is how the suite simulates a
// crashed or isolated node, which can neither renew nor resign.
func (f *Backend) Partition() { f.in.partition() }

func (in *injector) partition() {
	in.mu.Lock()
	in.partitioned = true
	in.mu.Unlock()
	in.breakFeeds(fmt.Errorf("%w: partitioned", ErrInjected))
}

// Heal removes every fault and ends a partition.
func (f *Backend) Heal() { f.in.heal() }

func (in *injector) heal() {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.faults = nil
	in.partitioned = false
}

// quiet reports whether no fault of m is armed and the wrapper is not
// partitioned: a call of m now would run as it is.
func (in *injector) quiet(m Method) bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.partitioned {
		return false
	}
	for _, af := range in.faults {
		if af.Method == m {
			return false
		}
	}
	return true
}

// countCall counts a call of m about elections that ran without faults.
func (in *injector) countCall(m Method, elections []string) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.calls[m]++
	for _, e := range elections {
		in.calls[countKey(m, e)]++
	}
}

// outcome is what the faults that hit one call make of it.
type outcome struct {
	err        error         // return it instead of the call's result
	after      bool          // ... after making the call
	replyDelay time.Duration // hold the reply back this long
	late       bool          // make the call even if the caller gave up (Fault.Late)
	writes     map[string]Fault
}

// before runs the faults that hit this call of m about elections (none:
// the call is about no election). In a batch (perWrite), the faults of one
// election that neither delay nor hang are left to its write (writes).
func (in *injector) before(ctx context.Context, m Method, elections []string, perWrite bool) outcome {
	in.mu.Lock()
	in.calls[m]++
	n := in.calls[m]
	for _, e := range elections {
		in.calls[countKey(m, e)]++
	}
	if in.partitioned {
		in.mu.Unlock()
		return outcome{err: fmt.Errorf("%w: partitioned", ErrInjected)}
	}
	var hit []Fault
	kept := in.faults[:0]
	for _, af := range in.faults {
		switch {
		case af.Method != m:
			kept = append(kept, af)
		case af.Election != "" && !slices.Contains(elections, af.Election):
			kept = append(kept, af)
		case af.call == 0:
			hit = append(hit, af.Fault)
			kept = append(kept, af)
		case af.call == n && af.Election == "", af.Election != "" && af.call == in.calls[countKey(m, af.Election)]:
			hit = append(hit, af.Fault)
		default:
			kept = append(kept, af)
		}
	}
	in.faults = kept
	in.mu.Unlock()
	var o outcome
	for _, ft := range hit {
		if perWrite && ft.Election != "" && !ft.Hang && ft.Delay == 0 && ft.DelayReply == 0 {
			if o.writes == nil {
				o.writes = make(map[string]Fault)
			}
			o.writes[ft.Election] = ft
			continue
		}
		if ft.Hang {
			<-ctx.Done()
			return outcome{err: ctx.Err()}
		}
		if ft.Late {
			time.Sleep(ft.Delay)
			o.late = true
		} else if !sleep(ctx, ft.Delay) {
			return outcome{err: ctx.Err()}
		}
		o.replyDelay = max(o.replyDelay, ft.DelayReply)
		if ft.Err != nil || (ft.Delay == 0 && ft.DelayReply == 0) {
			o.err, o.after = injected(ft), ft.After
			return o
		}
	}
	return o
}

func injected(ft Fault) error {
	if ft.Err != nil {
		return ft.Err
	}
	return ErrInjected
}

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// reply hands back err after the outcome's reply delay; a reply still held
// back when ctx ends is lost (ctx's error).
func (o outcome) reply(ctx context.Context, err error) error {
	if !sleep(ctx, o.replyDelay) {
		return ctx.Err()
	}
	return err
}

func (f *Backend) names() []string { return []string{f.inner.Name()} }

// Start injects faults into Backend.Start.
func (f *Backend) Start(ctx context.Context) error {
	return call(ctx, f.in.before(ctx, MethodStart, f.names(), false), f.inner.Start)
}

// Create injects faults into Backend.Create.
func (f *Backend) Create(ctx context.Context) error {
	return call(ctx, f.in.before(ctx, MethodCreate, f.names(), false), f.inner.Create)
}

// call makes a call that returns only an error, as the outcome says.
func call(ctx context.Context, o outcome, fn func(context.Context) error) error {
	if o.late && o.err == nil {
		err := fn(context.WithoutCancel(ctx))
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return o.reply(ctx, err)
	}
	if o.err != nil {
		if o.after {
			_ = fn(ctx)
		}
		return o.err
	}
	return o.reply(ctx, fn(ctx))
}

// Get injects faults into Backend.Get.
func (f *Backend) Get(ctx context.Context) (heartbeat.Record, error) {
	o := f.in.before(ctx, MethodGet, f.names(), false)
	if o.err != nil {
		if o.after {
			_, _ = f.inner.Get(ctx)
		}
		return heartbeat.Record{}, o.err
	}
	r, err := f.inner.Get(ctx)
	if !sleep(ctx, o.replyDelay) {
		return heartbeat.Record{}, ctx.Err()
	}
	return r, err
}

// Heartbeat injects faults into Backend.Heartbeat. With Fault.After the
// write is made and its result thrown away, as when a reply is lost.
func (f *Backend) Heartbeat(ctx context.Context, expected, next heartbeat.Record) (heartbeat.Record, error) {
	f.in.logWrite(backend.Write{Expected: expected, Next: next})
	return f.in.heartbeat(ctx, f.in.before(ctx, MethodHeartbeat, f.names(), false), expected, next, f.inner.Heartbeat)
}

func (in *injector) heartbeat(ctx context.Context, o outcome, expected, next heartbeat.Record,
	fn func(context.Context, heartbeat.Record, heartbeat.Record) (heartbeat.Record, error)) (heartbeat.Record, error) {
	if o.err != nil {
		if o.after {
			_, _ = fn(ctx, expected, next)
		}
		return heartbeat.Record{}, o.err
	}
	r, err := fn(ctx, expected, next)
	if !sleep(ctx, o.replyDelay) {
		return heartbeat.Record{}, ctx.Err()
	}
	return r, err
}

// HeartbeatGuarded injects faults into the wrapped backend's guarded
// write, as Heartbeat does.
func (f *Backend) HeartbeatGuarded(ctx context.Context, expected, next heartbeat.Record, guard backend.Guard) (heartbeat.Record, error) {
	g, ok := f.inner.(backend.GuardElection)
	if !ok {
		return heartbeat.Record{}, fmt.Errorf("faulty: the wrapped backend (%T) has no guarded write: %w", f.inner, backend.ErrUnsupported)
	}
	f.in.logWrite(backend.Write{Expected: expected, Next: next})
	return f.in.heartbeat(ctx, f.in.before(ctx, MethodHeartbeatGuarded, f.names(), false), expected, next,
		func(ctx context.Context, expected, next heartbeat.Record) (heartbeat.Record, error) {
			return g.HeartbeatGuarded(ctx, expected, next, guard)
		})
}

// AlignRenewal passes the renewal grid of the wrapped backend through (a
// Backend of a batching base.Elections has one), so that a wrapped Feed
// renews on it.
func (f *Backend) AlignRenewal(due time.Time, interval time.Duration) time.Time {
	if a, ok := f.inner.(backend.Aligner); ok {
		return a.AlignRenewal(due, interval)
	}
	return due
}

// SubmitHeartbeat forwards a submitted write to the wrapped Election
// (backend.Submitter) while no fault is armed for Heartbeat and the
// wrapper is not partitioned; the write is counted and logged as a
// Heartbeat call. Otherwise it reports false, and the Feed calls
// Heartbeat, where the faults are injected.
func (f *Backend) SubmitHeartbeat(ctx context.Context, deadline time.Time, expected, next heartbeat.Record, done func(heartbeat.Record, error)) bool {
	s, ok := f.inner.(backend.Submitter)
	if !ok || !f.in.quiet(MethodHeartbeat) {
		return false
	}
	if !s.SubmitHeartbeat(ctx, deadline, expected, next, done) {
		return false
	}
	f.in.countCall(MethodHeartbeat, f.names())
	f.in.logWrite(backend.Write{Expected: expected, Next: next})
	return true
}

// Subscribe injects faults into Backend.Subscribe and wraps the feed so
// that BreakFeed and Partition can break it.
func (f *Backend) Subscribe(ctx context.Context) (<-chan backend.Notification, error) {
	return f.in.subscribe(ctx, ctx, f.in.before(ctx, MethodSubscribe, f.names(), false), f.inner.Subscribe)
}

// subscribe calls fn, the wrapped Subscribe, with the outcome o drawn for
// it, and wraps its feed so that BreakFeed and Partition can break it.
// ctx bounds the call; the feed lasts until feedCtx ends.
func (in *injector) subscribe(ctx, feedCtx context.Context, o outcome, fn func(context.Context) (<-chan backend.Notification, error)) (<-chan backend.Notification, error) {
	if o.err != nil {
		return nil, o.err
	}
	innerCtx, cancel := context.WithCancel(feedCtx)
	ch, err := fn(innerCtx)
	if err = o.reply(ctx, err); err != nil {
		cancel()
		if ch != nil {
			go func() {
				for range ch {
				}
			}()
		}
		return nil, err
	}
	s := &faultySub{out: make(chan backend.Notification), broken: make(chan error, 1)}
	in.mu.Lock()
	in.subs[s] = struct{}{}
	in.mu.Unlock()
	go func() {
		defer func() {
			in.mu.Lock()
			delete(in.subs, s)
			in.mu.Unlock()
		}()
		s.forward(feedCtx, ch, cancel)
	}()
	return s.out, nil
}

// breakable is an open subscription of a wrapper: BreakFeed and Partition
// end it with a Failed notification.
type breakable interface{ breakWith(err error) }

type faultySub struct {
	out    chan backend.Notification
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
func (s *faultySub) forward(ctx context.Context, in <-chan backend.Notification, cancel context.CancelFunc) {
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
			if n.Type == backend.Failed {
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
	case s.out <- backend.Notification{Type: backend.Failed, Err: err}:
	case <-ctx.Done():
	}
}

// SubscribeFunc injects the Subscribe faults into the wrapped Election's
// SubscribeFunc (backend.FuncSubscriber), or, if it lacks one, into its
// Subscribe, whose notifications it then hands to deliver on a goroutine
// of its own; BreakFeed and Partition break it as they break a channel
// feed.
func (f *Backend) SubscribeFunc(ctx context.Context, deliver func(backend.Notification)) (func(), error) {
	return f.in.subscribeFunc(ctx, f.in.before(ctx, MethodSubscribe, f.names(), false), f.inner, f.inner.Subscribe, deliver)
}

// subscribeFunc is SubscribeFunc of a Backend or a Store wrapping inner,
// once the Subscribe faults' outcome o is known: inner's own SubscribeFunc
// if it has one, else its channel feed (subscribe) read for deliver.
func (in *injector) subscribeFunc(ctx context.Context, o outcome, inner any, subscribe func(context.Context) (<-chan backend.Notification, error), deliver func(backend.Notification)) (func(), error) {
	if o.err != nil {
		return nil, o.err
	}
	s := &funcSub{deliver: deliver}
	if fs, ok := inner.(backend.FuncSubscriber); ok {
		cancel, err := fs.SubscribeFunc(ctx, s.push)
		if err = o.reply(ctx, err); err != nil {
			if cancel != nil {
				cancel()
			}
			return nil, err
		}
		s.cancelInner = cancel
	} else {
		// The channel feed, wrapped as Subscribe's (it breaks), and read
		// for deliver.
		fctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		ch, err := in.subscribe(ctx, fctx, o, subscribe)
		if err != nil {
			cancel()
			return nil, err
		}
		done := make(chan struct{})
		s.cancelInner = func() { cancel(); <-done }
		go func() {
			defer close(done)
			for n := range ch {
				s.push(n)
			}
		}()
		return s.end, nil
	}
	in.mu.Lock()
	in.subs[s] = struct{}{}
	in.mu.Unlock()
	return func() {
		in.mu.Lock()
		delete(in.subs, s)
		in.mu.Unlock()
		s.end()
	}, nil
}

// funcSub is a subscription of SubscribeFunc: push hands the wrapped
// feed's notifications to deliver until the subscription ends (Failed,
// cancelled or broken), never two at once.
type funcSub struct {
	deliver     func(backend.Notification)
	cancelInner func()

	mu    sync.Mutex
	ended bool
}

func (s *funcSub) push(n backend.Notification) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return
	}
	s.deliver(n)
	s.ended = n.Type == backend.Failed
}

func (s *funcSub) breakWith(err error) {
	s.push(backend.Notification{Type: backend.Failed, Err: err})
	s.cancelInner()
}

// end stops the deliveries and cancels the wrapped feed.
func (s *funcSub) end() {
	s.mu.Lock()
	s.ended = true
	s.mu.Unlock()
	s.cancelInner()
}

var (
	_ backend.PresenceElection = (*Backend)(nil)
	_ backend.GuardElection    = (*Backend)(nil)
	_ backend.Aligner          = (*Backend)(nil)
	_ backend.Submitter        = (*Backend)(nil)
	_ backend.FuncSubscriber   = (*Backend)(nil)
)

func (f *Backend) presence() (backend.PresenceElection, error) {
	pb, ok := f.inner.(backend.PresenceElection)
	if !ok {
		return nil, fmt.Errorf("faulty: the wrapped backend (%T) has no presence capability: %w", f.inner, backend.ErrUnsupported)
	}
	return pb, nil
}

// Present injects faults into the wrapped backend's Present.
func (f *Backend) Present(ctx context.Context, p backend.Presence) error {
	pb, err := f.presence()
	if err != nil {
		return err
	}
	return call(ctx, f.in.before(ctx, MethodPresent, f.names(), false), func(ctx context.Context) error { return pb.Present(ctx, p) })
}

// Absent injects faults into the wrapped backend's Absent.
func (f *Backend) Absent(ctx context.Context, node string) error {
	pb, err := f.presence()
	if err != nil {
		return err
	}
	return call(ctx, f.in.before(ctx, MethodAbsent, f.names(), false), func(ctx context.Context) error { return pb.Absent(ctx, node) })
}

// Participants injects faults into the wrapped backend's Participants.
func (f *Backend) Participants(ctx context.Context) ([]backend.Presence, time.Time, error) {
	pb, err := f.presence()
	if err != nil {
		return nil, time.Time{}, err
	}
	if o := f.in.before(ctx, MethodParticipants, f.names(), false); o.err != nil {
		return nil, time.Time{}, o.err
	}
	return pb.Participants(ctx)
}

// Store wraps a backend.Store and injects the faults of Fault into its calls,
// as Backend does into a Backend's: put under a base.Elections, it shows
// what a store and network do to the batches of every election of a
// process. It has the batch capabilities (HeartbeatBatch, GetBatch,
// PresentBatch, ParticipantsBatch, each made of single calls when the
// wrapped store lacks it), the presence capability and the guarded write
// (failing with backend.ErrUnsupported when the wrapped store lacks them)
// and backend.FuncSubscriber (reading the
// wrapped store's channel when it lacks that). It is safe for concurrent
// use.
type Store struct {
	backend.Store
	in *injector
}

var (
	_ backend.BatchStore         = (*Store)(nil)
	_ backend.BatchReader        = (*Store)(nil)
	_ backend.PresenceStore      = (*Store)(nil)
	_ backend.PresenceBatchStore = (*Store)(nil)
	_ backend.GuardStore         = (*Store)(nil)
	_ backend.FuncSubscriber     = (*Store)(nil)
)

// WrapStore returns s wrapped in a Store that injects nothing until told to.
func WrapStore(s backend.Store) *Store {
	return &Store{Store: s, in: newInjector()}
}

// Inject adds a fault. MethodHeartbeat hits single writes, and
// MethodHeartbeatBatch batches (with Election set: the write of one
// election in them, see Fault.Election).
func (f *Store) Inject(ft Fault) { f.in.inject(ft) }

// Calls returns how many calls of m the wrapper has seen.
func (f *Store) Calls(m Method) int { return f.in.count(m) }

// BreakFeed ends every open subscription with a Failed notification
// carrying err (ErrInjected if nil). Later subscriptions work.
func (f *Store) BreakFeed(err error) { f.in.breakFeeds(err) }

// Partition cuts the store off: every call fails with ErrInjected and open
// subscriptions break, until Heal.
func (f *Store) Partition() { f.in.partition() }

// Heal removes every fault and ends a partition.
func (f *Store) Heal() { f.in.heal() }

// Writes returns every write so far (the first 100,000), single or in a
// batch, in call order, whether or not a fault hit it.
func (f *Store) Writes() []backend.Write { return f.in.writeLog() }

// Start injects faults into Store.Start.
func (f *Store) Start(ctx context.Context) error {
	return call(ctx, f.in.before(ctx, MethodStart, nil, false), f.Store.Start)
}

// Create injects faults into Store.Create.
func (f *Store) Create(ctx context.Context) error {
	return call(ctx, f.in.before(ctx, MethodCreate, nil, false), f.Store.Create)
}

// Get injects faults into Store.Get.
func (f *Store) Get(ctx context.Context, election string) (heartbeat.Record, error) {
	o := f.in.before(ctx, MethodGet, []string{election}, false)
	if o.err != nil {
		if o.after {
			_, _ = f.Store.Get(ctx, election)
		}
		return heartbeat.Record{}, o.err
	}
	r, err := f.Store.Get(ctx, election)
	if !sleep(ctx, o.replyDelay) {
		return heartbeat.Record{}, ctx.Err()
	}
	return r, err
}

// Heartbeat injects faults into Store.Heartbeat, a single write.
func (f *Store) Heartbeat(ctx context.Context, expected, next heartbeat.Record) (heartbeat.Record, error) {
	f.in.logWrite(backend.Write{Expected: expected, Next: next})
	return f.in.heartbeat(ctx, f.in.before(ctx, MethodHeartbeat, []string{next.Election}, false), expected, next, f.Store.Heartbeat)
}

// HeartbeatGuarded injects faults into the wrapped store's guarded
// write, as Heartbeat does.
func (f *Store) HeartbeatGuarded(ctx context.Context, expected, next heartbeat.Record, guard backend.Guard) (heartbeat.Record, error) {
	g, ok := f.Store.(backend.GuardStore)
	if !ok {
		return heartbeat.Record{}, fmt.Errorf("faulty: the wrapped store (%T) has no guarded write: %w", f.Store, backend.ErrUnsupported)
	}
	f.in.logWrite(backend.Write{Expected: expected, Next: next})
	return f.in.heartbeat(ctx, f.in.before(ctx, MethodHeartbeatGuarded, []string{next.Election}, false), expected, next,
		func(ctx context.Context, expected, next heartbeat.Record) (heartbeat.Record, error) {
			return g.HeartbeatGuarded(ctx, expected, next, guard)
		})
}

// HeartbeatBatch injects faults into a batch of writes: a fault without
// Election hits the whole batch (Err: nothing is written; After: all is
// written and the reply lost), one with Election the write of that
// election alone (see Fault.Election).
func (f *Store) HeartbeatBatch(ctx context.Context, writes []backend.Write) ([]backend.WriteResult, error) {
	names := make([]string, len(writes))
	for i, w := range writes {
		names[i] = w.Next.Election
		f.in.logWrite(w)
	}
	o := f.in.before(ctx, MethodHeartbeatBatch, names, true)
	if o.err != nil {
		if o.after {
			_, _ = f.batch(ctx, writes)
		}
		return nil, o.err
	}
	// The writes refused before the batch are left out of it.
	send := make([]backend.Write, 0, len(writes))
	for _, w := range writes {
		if ft, ok := o.writes[w.Next.Election]; !ok || ft.After {
			send = append(send, w)
		}
	}
	res, err := f.batch(ctx, send)
	if !sleep(ctx, o.replyDelay) {
		return nil, ctx.Err()
	}
	if err != nil {
		return nil, err
	}
	out := make([]backend.WriteResult, len(writes))
	j := 0
	for i, w := range writes {
		ft, hit := o.writes[w.Next.Election]
		if !hit || ft.After {
			out[i] = res[j]
			j++
		}
		if hit {
			out[i] = backend.WriteResult{Err: injected(ft)}
		}
	}
	return out, nil
}

// batch writes through the wrapped store's HeartbeatBatch, or one write
// after the other when it has none.
func (f *Store) batch(ctx context.Context, writes []backend.Write) ([]backend.WriteResult, error) {
	if len(writes) == 0 {
		return nil, nil
	}
	if bs, ok := f.Store.(backend.BatchStore); ok {
		res, err := bs.HeartbeatBatch(ctx, writes)
		if err == nil && len(res) != len(writes) {
			err = fmt.Errorf("faulty: the wrapped store returned %d results for %d writes", len(res), len(writes))
		}
		return res, err
	}
	out := make([]backend.WriteResult, len(writes))
	for i, w := range writes {
		out[i].Record, out[i].Err = f.Store.Heartbeat(ctx, w.Expected, w.Next)
	}
	return out, nil
}

// GetBatch injects faults into a batch of reads (as a whole).
func (f *Store) GetBatch(ctx context.Context, elections []string) ([]backend.ReadResult, error) {
	o := f.in.before(ctx, MethodGetBatch, elections, false)
	if o.err != nil {
		return nil, o.err
	}
	var res []backend.ReadResult
	var err error
	if br, ok := f.Store.(backend.BatchReader); ok {
		res, err = br.GetBatch(ctx, elections)
	} else {
		res = make([]backend.ReadResult, len(elections))
		for i, e := range elections {
			res[i].Record, res[i].Err = f.Store.Get(ctx, e)
		}
	}
	if !sleep(ctx, o.replyDelay) {
		return nil, ctx.Err()
	}
	return res, err
}

// Subscribe injects faults into Store.Subscribe and wraps the feed so that
// BreakFeed and Partition can break it.
func (f *Store) Subscribe(ctx context.Context) (<-chan backend.Notification, error) {
	return f.in.subscribe(ctx, ctx, f.in.before(ctx, MethodSubscribe, nil, false), f.Store.Subscribe)
}

// SubscribeFunc is Backend.SubscribeFunc for the wrapped Store: its own
// SubscribeFunc (backend.FuncSubscriber) with the Subscribe faults, or its
// channel feed read for deliver.
func (f *Store) SubscribeFunc(ctx context.Context, deliver func(backend.Notification)) (func(), error) {
	return f.in.subscribeFunc(ctx, f.in.before(ctx, MethodSubscribe, nil, false), f.Store, f.Store.Subscribe, deliver)
}

func (f *Store) presence() (backend.PresenceStore, error) {
	ps, ok := f.Store.(backend.PresenceStore)
	if !ok {
		return nil, fmt.Errorf("faulty: the wrapped store (%T) has no presence capability: %w", f.Store, backend.ErrUnsupported)
	}
	return ps, nil
}

// Present injects faults into the wrapped store's Present.
func (f *Store) Present(ctx context.Context, election string, p backend.Presence) error {
	ps, err := f.presence()
	if err != nil {
		return err
	}
	return call(ctx, f.in.before(ctx, MethodPresent, []string{election}, false), func(ctx context.Context) error { return ps.Present(ctx, election, p) })
}

// Absent injects faults into the wrapped store's Absent.
func (f *Store) Absent(ctx context.Context, election, node string) error {
	ps, err := f.presence()
	if err != nil {
		return err
	}
	return call(ctx, f.in.before(ctx, MethodAbsent, []string{election}, false), func(ctx context.Context) error { return ps.Absent(ctx, election, node) })
}

// Participants injects faults into the wrapped store's Participants.
func (f *Store) Participants(ctx context.Context, election string) ([]backend.Presence, time.Time, error) {
	ps, err := f.presence()
	if err != nil {
		return nil, time.Time{}, err
	}
	if o := f.in.before(ctx, MethodParticipants, []string{election}, false); o.err != nil {
		return nil, time.Time{}, o.err
	}
	return ps.Participants(ctx, election)
}

// PresentBatch injects faults into a batch of presence writes: a fault
// without Election hits the whole batch (Err: nothing is written; After:
// all is written and the reply lost), one with Election the writes of
// that election alone (see Fault.Election).
func (f *Store) PresentBatch(ctx context.Context, writes []backend.PresenceWrite) ([]error, error) {
	ps, err := f.presence()
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(writes))
	for _, w := range writes {
		if !slices.Contains(names, w.Election) {
			names = append(names, w.Election)
		}
	}
	o := f.in.before(ctx, MethodPresentBatch, names, true)
	if o.err != nil {
		if o.after {
			_, _ = presentBatch(ctx, ps, writes)
		}
		return nil, o.err
	}
	// The writes refused before the batch are left out of it.
	send := make([]backend.PresenceWrite, 0, len(writes))
	for _, w := range writes {
		if ft, ok := o.writes[w.Election]; !ok || ft.After {
			send = append(send, w)
		}
	}
	res, err := presentBatch(ctx, ps, send)
	if !sleep(ctx, o.replyDelay) {
		return nil, ctx.Err()
	}
	if err != nil {
		return nil, err
	}
	out := make([]error, len(writes))
	j := 0
	for i, w := range writes {
		ft, hit := o.writes[w.Election]
		if !hit || ft.After {
			out[i] = res[j]
			j++
		}
		if hit {
			out[i] = injected(ft)
		}
	}
	return out, nil
}

// presentBatch writes through ps's PresentBatch, or one write after the
// other when it has none.
func presentBatch(ctx context.Context, ps backend.PresenceStore, writes []backend.PresenceWrite) ([]error, error) {
	if len(writes) == 0 {
		return nil, nil
	}
	if bs, ok := ps.(backend.PresenceBatchStore); ok {
		res, err := bs.PresentBatch(ctx, writes)
		if err == nil && len(res) != len(writes) {
			err = fmt.Errorf("faulty: the wrapped store returned %d results for %d presence writes", len(res), len(writes))
		}
		return res, err
	}
	out := make([]error, len(writes))
	for i, w := range writes {
		out[i] = ps.Present(ctx, w.Election, w.Presence)
	}
	return out, nil
}

// ParticipantsBatch injects faults into a batch of reads of participants
// (as a whole, as GetBatch).
func (f *Store) ParticipantsBatch(ctx context.Context, elections []string) ([]backend.ParticipantsResult, error) {
	ps, err := f.presence()
	if err != nil {
		return nil, err
	}
	o := f.in.before(ctx, MethodParticipantsBatch, elections, false)
	if o.err != nil {
		return nil, o.err
	}
	var res []backend.ParticipantsResult
	if bs, ok := ps.(backend.PresenceBatchStore); ok {
		res, err = bs.ParticipantsBatch(ctx, elections)
	} else {
		res = make([]backend.ParticipantsResult, len(elections))
		for i, e := range elections {
			res[i].Presences, res[i].Now, res[i].Err = ps.Participants(ctx, e)
		}
	}
	if !sleep(ctx, o.replyDelay) {
		return nil, ctx.Err()
	}
	return res, err
}
