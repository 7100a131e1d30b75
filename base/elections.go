package base

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/internal/mailbox"
)

// Defaults of ElectionsOptions.
const (
	// defaultMaxBatch is the default of ElectionsOptions.MaxBatch.
	defaultMaxBatch = 5000
	// batchWindowDivisor: by default a renewal waits a twentieth of its
	// heartbeat interval for the renewals of other elections (50 ms with
	// the default timing), a small part of the lease's margin.
	batchWindowDivisor = 20
)

// Limits of the queue of one election's changefeed: what the shared feed
// has received for it and its Feed has not taken yet.
const (
	// maxFeedQueue: a subscription whose reader falls this far behind
	// fails (its Feed reopens it and reads the record).
	maxFeedQueue = 4096
)

// ElectionsOptions configures Elections. The zero value of every field
// means its default.
type ElectionsOptions struct {
	// Logger receives the shared changefeed's failures. Default: discard.
	Logger *slog.Logger
	// NoBatch turns batching off even when the Store is a BatchStore, a
	// BatchReader or a PresenceBatchStore: every write is a
	// compare-and-set of its own, every read a Get of its own, every
	// presence refresh a Present of its own.
	//
	// Deprecated: one statement per election does not hold at scale. A
	// process leading N elections sends N renewals per heartbeat interval
	// through its pool: 1,000 elections at a 480 ms heartbeat are 2,083
	// statements a second, where a pool of 4 connections on a loaded
	// 2-core machine carried about 550; renewals fell behind and leases
	// ended (beside two busy loops for 5 minutes: 10,688 leases lost, 2.8 %
	// of the election-seconds without a leader). The default renews all
	// the elections of a process in one statement per interval. NoBatch
	// stays for tests of a Store's unbatched path.
	NoBatch bool
	// MaxBatch bounds the writes of one batch. Default defaultMaxBatch.
	MaxBatch int
	// BatchWindow is how long a renewal waits for the renewals of other
	// elections before their batch is sent. Claims and vacancies never
	// wait for one. Renewals of elections with the same HeartbeatInterval
	// are due at the same instants (the Feeds renew a little early to
	// that end), so one batch a window carries them all, however long the
	// goroutines of thousands of elections take to wake. The lease runs
	// from the time the Feed handed the renewal over, so the window only
	// spends a little of the lease's margin. Default: the heartbeat
	// interval divided by batchWindowDivisor.
	BatchWindow time.Duration
}

// Elections shares one Store among the elections of a process: the Store
// is started and created once, its one changefeed serves every election
// (the notifications of each are queued and coalesced here, once for all
// backends), and, when the Store is a BatchStore, the renewals of all
// elections due at the same time are written in one batch; when it is a
// PresenceBatchStore, the presence refreshes of the elections go out
// together too, a few batches per presence interval. Election returns the
// backend.Election of one election, for a Feed.
//
// Elections owns the Store: Close closes it. Its methods are safe for
// concurrent use.
type Elections struct {
	store     backend.Store
	batch     backend.BatchStore // nil: no batching
	log       *slog.Logger
	maxBatch  int
	window    time.Duration
	epoch     time.Time // origin of the renewal grid
	ctx       context.Context
	cancel    context.CancelFunc
	owned     bool // made by Open: closing its one Election closes it
	wg        sync.WaitGroup
	writes    *writeQueue
	batchRead backend.BatchReader // nil: every Get alone
	reads     chan *readReq
	run       *mailbox.Runner // the loops' takers (sharedTakers)
	clock     renewClock      // ticks the loops' aligned renewals (renewalTicker)
	pres      *presenceBatch  // nil: every presence write alone
	silence   silence         // the elections judge a silent leader together

	started, created onceCall

	mu     sync.Mutex
	closed atomic.Bool // set under mu (so opening a feed and Close exclude each other); read without it by every write
	open   map[string]*electionBackend
	feed   *sharedFeed // open or opening; nil when none
}

// NewElections returns an Elections on s. It does no I/O.
func NewElections(s backend.Store, opts ElectionsOptions) (*Elections, error) {
	if s == nil {
		return nil, fmt.Errorf("%w: store is nil", ErrInvalidConfig)
	}
	if opts.MaxBatch < 0 || opts.BatchWindow < 0 {
		return nil, fmt.Errorf("%w: MaxBatch (%d) and BatchWindow (%v) must not be negative", ErrInvalidConfig, opts.MaxBatch, opts.BatchWindow)
	}
	if opts.MaxBatch == 0 {
		opts.MaxBatch = defaultMaxBatch
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &Elections{
		store: s, log: log, maxBatch: opts.MaxBatch, window: opts.BatchWindow,
		epoch: time.Now(), ctx: ctx, cancel: cancel,
		open: make(map[string]*electionBackend),
		run:  mailbox.NewRunner(runtime.GOMAXPROCS(0)),
	}
	if bs, ok := s.(backend.BatchStore); ok && !opts.NoBatch {
		e.batch = bs
		e.writes = newWriteQueue()
		e.wg.Add(1)
		go e.batcher()
	}
	if br, ok := s.(backend.BatchReader); ok && !opts.NoBatch {
		e.batchRead = br
		e.reads = make(chan *readReq, opts.MaxBatch)
		e.wg.Add(1)
		go e.reader()
	}
	e.startPresenceBatch(s, opts)
	return e, nil
}

// Open returns the backend.Election of one election on s, for a process with one
// election: it owns s, and closing it (which the Feed does when it
// stops) closes s. Writes are not batched.
func Open(s backend.Store, election string) (backend.Election, error) {
	e, err := NewElections(s, ElectionsOptions{NoBatch: true})
	if err != nil {
		return nil, err
	}
	e.owned = true
	b, err := e.Election(election)
	if err != nil {
		_ = e.Close()
		return nil, err
	}
	return b, nil
}

// Election returns the backend.Election of election, for one Feed. An election can
// have one open Election per Elections: a second one fails with an error
// matching ErrInvalidConfig until the first is closed (nodes of one
// election in one process, as in tests, each need an Elections, and a
// Store, of their own). A closed Elections fails with ErrClosed.
func (e *Elections) Election(election string) (backend.Election, error) {
	return e.newBackend(election, false)
}

// Observer returns a backend.Election of election for an observe-only Feed
// (Options.ObserveOnly): any number of them may be open on one Elections,
// beside the one that campaigns, and all share the one changefeed.
// Its Heartbeat fails with an error matching ErrObserveOnly.
func (e *Elections) Observer(election string) (backend.Election, error) {
	return e.newBackend(election, true)
}

func (e *Elections) newBackend(election string, observer bool) (backend.Election, error) {
	if err := heartbeat.ValidateName("election name", election); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed.Load() {
		return nil, fmt.Errorf("leaderfeed: election %q: %w", election, ErrClosed)
	}
	b := &electionBackend{e: e, name: election, slot: renewalSlot(election), observer: observer}
	if observer {
		return b, nil
	}
	if _, ok := e.open[election]; ok {
		return nil, fmt.Errorf("%w: election %q is open on this Elections already (one Election per election; close it first)", ErrInvalidConfig, election)
	}
	e.open[election] = b
	return b, nil
}

// Feed returns a Feed for node nodeID in election: New on Election(election),
// or on Observer(election) when opts.ObserveOnly is set.
func (e *Elections) Feed(election, nodeID string, opts Options) (*Feed, error) {
	open := e.Election
	if opts.ObserveOnly {
		open = e.Observer
	}
	b, err := open(election)
	if err != nil {
		return nil, err
	}
	f, err := New(b, nodeID, opts)
	if err != nil {
		_ = b.Close()
		return nil, err
	}
	return f, nil
}

// Close closes the Store. The changefeeds of every election end with a
// Failed notification matching ErrClosed, and every method of their
// Backends fails with ErrClosed: their Feeds report it and keep reading
// nothing until stopped. Close waits for the goroutines the elections
// share, so once their Feeds have stopped none is left. Close is
// idempotent.
func (e *Elections) Close() error {
	e.mu.Lock()
	if e.closed.Load() {
		e.mu.Unlock()
		return nil
	}
	e.closed.Store(true)
	sf := e.feed
	e.feed = nil
	e.mu.Unlock()
	e.cancel()
	e.clock.close()
	if sf != nil {
		sf.fail(fmt.Errorf("leaderfeed: elections: %w", ErrClosed))
	}
	e.wg.Wait()
	e.run.Wait()
	return e.store.Close()
}

func (e *Elections) isClosed() bool { return e.closed.Load() }

// ---- one election's backend.Election ----

// electionBackend is the backend.Election of one election on an Elections.
type electionBackend struct {
	e        *Elections
	name     string
	slot     uint32       // renewalSlot(name)
	observer bool         // made by Observer: writes nothing
	interval atomic.Int64 // the Feed's heartbeat interval, from AlignRenewal

	mu     sync.Mutex
	closed bool
	subs   []*feedSub // most elections have one
}

func (b *electionBackend) Name() string { return b.name }

func (b *electionBackend) takers() *mailbox.Runner { return b.e.run }

func (b *electionBackend) check(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed || b.e.isClosed() {
		return fmt.Errorf("leaderfeed: election %q: %w", b.name, ErrClosed)
	}
	return nil
}

// Start starts the Store, once for all elections (again after a failure).
func (b *electionBackend) Start(ctx context.Context) error {
	if err := b.check(ctx); err != nil {
		return err
	}
	return b.e.started.do(ctx, b.e.store.Start)
}

// Create runs the Store's Create, once for all elections (again after a
// failure).
func (b *electionBackend) Create(ctx context.Context) error {
	if err := b.check(ctx); err != nil {
		return err
	}
	return b.e.created.do(ctx, b.e.store.Create)
}

func (b *electionBackend) Get(ctx context.Context) (heartbeat.Record, error) {
	if err := b.check(ctx); err != nil {
		return heartbeat.Record{}, err
	}
	if b.e.batchRead != nil {
		return b.e.read(ctx, b.name)
	}
	return b.e.store.Get(ctx, b.name)
}

func (b *electionBackend) Heartbeat(ctx context.Context, expected, next heartbeat.Record) (heartbeat.Record, error) {
	if err := b.writable(ctx, &next); err != nil {
		return heartbeat.Record{}, err
	}
	if b.e.batch == nil {
		return b.e.store.Heartbeat(ctx, expected, next)
	}
	return b.e.write(ctx, backend.Write{Expected: expected, Next: next}, b.window())
}

// writable checks a write before it is sent: the Backend is open, next
// (its Election set to this one's when empty) is of this election, and
// this Backend writes.
func (b *electionBackend) writable(ctx context.Context, next *heartbeat.Record) error {
	if err := b.check(ctx); err != nil {
		return err
	}
	if next.Election == "" {
		next.Election = b.name
	}
	if next.Election != b.name || b.observer {
		return b.refuse(next.Election)
	}
	return nil
}

// refuse returns Heartbeat's error for a write of election (the name of
// its record) that it does not send. A function of its own, so that the
// frame of Heartbeat, under every store's, stays small.
//
//go:noinline
func (b *electionBackend) refuse(election string) error {
	if election != b.name {
		return fmt.Errorf("%w: %w: the Election of %q was given a record of election %q",
			ErrInvalidConfig, heartbeat.ErrInvalidRecord, b.name, election)
	}
	return fmt.Errorf("leaderfeed: election %q: an Observer backend writes nothing: %w", b.name, ErrObserveOnly)
}

// AlignRenewal returns when a renewal due at due is sent: the latest
// instant at or before due of the election's renewal grid, when writes are
// batched. The grid has one instant per heartbeat interval, shifted by
// half an interval for half of the elections (by a hash of the name,
// renewalSlots): the renewals of every election with that interval fall on
// two instants an interval and go out in two batches, each half as large
// as one, so that a process with thousands of elections wakes, writes and
// takes in the replies of half of them at a time. A leader that renewed at
// an instant of its grid is due again at the next one, so it keeps its
// place; a new leader renews at the first instant after its claim, less
// than an interval early. Renewing early is safe: a lease runs from its
// renewal's send time.
func (b *electionBackend) AlignRenewal(due time.Time, interval time.Duration) time.Time {
	if b.e.batch == nil || interval <= 0 {
		return due
	}
	b.interval.Store(int64(interval))
	origin := b.e.epoch.Add(interval * time.Duration(b.slot) / renewalSlots)
	k := due.Sub(origin) / interval
	return origin.Add(k * interval)
}

// renewalSlots is the number of instants per heartbeat interval on which
// the renewals of a batching Elections fall (AlignRenewal).
const renewalSlots = 2

// tickAt ticks the Feed's loop at a renewal instant AlignRenewal gave
// (renewalTicker), when writes are batched.
func (b *electionBackend) tickAt(at time.Time, tick func()) bool {
	return b.e.batch != nil && b.e.clock.tickAt(at, tick)
}

// silence lets the elections of a process judge a leader that went
// silent together (mass failover, machine.onSilent): when one of them
// found it silent, the others whose record that leader wrote hear of it
// after a delay drawn in [0, spread], so that of the processes that
// survive a crash, the one that drew the shortest claims the elections
// already due, and the others find them taken. The zero value is ready.
type silence struct {
	mu       sync.Mutex
	watchers map[uint64]func(leader string)
	next     uint64
	told     map[string]time.Time // when each leader was last told of, for a while
}

// maxSilentKeys bounds silence.told: the leaders told of within the last
// span are remembered, so that a thousand elections finding one leader
// silent tell the others once.
const maxSilentKeys = 1024

func (b *electionBackend) silent(leader string, spread time.Duration) {
	s, e := &b.e.silence, b.e
	now := time.Now()
	s.mu.Lock()
	if at, ok := s.told[leader]; ok && now.Sub(at) <= silentSpreadDivisor*spread {
		s.mu.Unlock()
		return
	}
	if s.told == nil || len(s.told) >= maxSilentKeys {
		s.told = make(map[string]time.Time)
	}
	s.told[leader] = now
	s.mu.Unlock()
	delay := time.Duration(rand.Int64N(int64(max(spread, 0)) + 1))
	e.clock.tickAt(now.Add(delay), func() {
		s.mu.Lock()
		heard := make([]func(string), 0, len(s.watchers))
		for _, f := range s.watchers {
			heard = append(heard, f)
		}
		s.mu.Unlock()
		for _, f := range heard {
			f(leader)
		}
	})
}

func (b *electionBackend) silentWatch(heard func(leader string)) (stop func()) {
	s := &b.e.silence
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.watchers == nil {
		s.watchers = make(map[uint64]func(string))
	}
	s.next++
	id := s.next
	s.watchers[id] = heard
	return func() {
		s.mu.Lock()
		delete(s.watchers, id)
		s.mu.Unlock()
	}
}

// renewClock ticks the loops of a batching Elections at their renewal
// instants. Their renewals fall on a few instants per heartbeat interval
// (AlignRenewal), so one timer, armed for the earliest, serves them all,
// where a timer per loop would be reset and fire (starting a goroutine)
// once per renewal. The zero value is ready.
type renewClock struct {
	mu     sync.Mutex
	slots  []clockSlot // earliest first
	timer  *time.Timer // armed for slots[0]
	closed bool
}

// clockSlot is one instant of a renewClock and the ticks due then.
type clockSlot struct {
	at    time.Time
	ticks []func()
}

// tickAt calls tick at at (at once if it has passed), on the clock's
// goroutine: tick must not block. It reports false, and never calls tick,
// when the clock is closed.
func (c *renewClock) tickAt(at time.Time, tick func()) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	i, found := slices.BinarySearchFunc(c.slots, at, func(s clockSlot, at time.Time) int { return s.at.Compare(at) })
	if !found {
		c.slots = slices.Insert(c.slots, i, clockSlot{at: at})
	}
	c.slots[i].ticks = append(c.slots[i].ticks, tick)
	if i == 0 && !found {
		if c.timer == nil {
			c.timer = time.AfterFunc(time.Until(at), c.fire)
		} else {
			c.timer.Reset(time.Until(at))
		}
	}
	return true
}

// fire calls the ticks of the instants that have passed.
func (c *renewClock) fire() {
	c.mu.Lock()
	now := time.Now()
	n := 0
	for n < len(c.slots) && !c.slots[n].at.After(now) {
		n++
	}
	due := slices.Clone(c.slots[:n])
	c.slots = slices.Delete(c.slots, 0, n)
	if len(c.slots) > 0 && !c.closed {
		c.timer.Reset(time.Until(c.slots[0].at))
	}
	c.mu.Unlock()
	for _, s := range due {
		for _, tick := range s.ticks {
			tick()
		}
	}
}

// close drops the ticks not yet due; later ones are refused.
func (c *renewClock) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	c.slots = nil
	if c.timer != nil {
		c.timer.Stop()
	}
}

// renewalSlot returns the slot of election's renewals, by a hash of its
// name (FNV-1a), in [0, renewalSlots).
func renewalSlot(election string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(election); i++ {
		h ^= uint32(election[i])
		h *= 16777619
	}
	return h % renewalSlots
}

func (b *electionBackend) Subscribe(ctx context.Context) (<-chan backend.Notification, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	return b.e.subscribe(ctx, b)
}

// SubscribeFunc is Subscribe handing each notification to to, in order,
// on the shared feed's goroutine, instead of queuing it for a channel
// (backend.FuncSubscriber).
func (b *electionBackend) SubscribeFunc(ctx context.Context, to func(backend.Notification)) (cancel func(), err error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	return b.e.subscribeDirect(ctx, b, to)
}

// Close ends the election's subscriptions and frees its name; the Store
// stays open for the other elections (unless Open made it).
func (b *electionBackend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	subs := slices.Clone(b.subs)
	b.mu.Unlock()
	for _, s := range subs {
		s.fail(fmt.Errorf("leaderfeed: election %q: %w", b.name, ErrClosed))
	}
	e := b.e
	e.mu.Lock()
	if e.open[b.name] == b {
		delete(e.open, b.name)
	}
	e.mu.Unlock()
	if e.owned {
		return e.Close()
	}
	return nil
}

// ---- start and create, once ----

// onceCall runs a call until it succeeds once; concurrent callers wait for
// the call in flight, and try themselves if it failed.
type onceCall struct {
	mu   sync.Mutex
	done bool
	wait chan struct{} // non-nil while a call runs
}

func (o *onceCall) do(ctx context.Context, fn func(context.Context) error) error {
	for {
		o.mu.Lock()
		if o.done {
			o.mu.Unlock()
			return nil
		}
		if o.wait == nil {
			ch := make(chan struct{})
			o.wait = ch
			o.mu.Unlock()
			err := fn(ctx)
			o.mu.Lock()
			o.wait, o.done = nil, err == nil
			o.mu.Unlock()
			close(ch)
			return err
		}
		ch := o.wait
		o.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// ---- the shared changefeed ----

// sharedFeed is one Subscribe of the Store, serving every election. It
// lives until it fails or the Elections closes; the next Subscribe after a
// failure opens a new one.
type sharedFeed struct {
	e      *Elections
	cancel context.CancelFunc
	ready  chan struct{} // closed when the open finished
	err    error         // of the open; set before ready is closed

	// Guarded by e.mu.
	dead    bool
	byName  map[string][]*feedSub // most elections have one
	all     map[*feedSub]struct{}
	failErr error
}

// subscribe returns a changefeed of b's election on the shared feed,
// opening the feed if none is open. The subscription is registered before
// the feed opens (or at once on an open feed), so that nothing the feed
// delivers after it listens is lost: a store that replays what it missed
// (a resumed MongoDB change stream) replays it to every subscriber.
func (e *Elections) subscribe(ctx context.Context, b *electionBackend) (<-chan backend.Notification, error) {
	sctx, cancel := context.WithCancel(ctx)
	s := newFeedSub(sctx, cancel, b)
	if err := e.register(ctx, b, s); err != nil {
		return nil, err
	}
	return s.pipe.C(), nil
}

// subscribeDirect is subscribe for SubscribeFunc: the subscription ends when
// the returned function is called.
func (e *Elections) subscribeDirect(ctx context.Context, b *electionBackend, to func(backend.Notification)) (func(), error) {
	s := &feedSub{name: b.name, to: to}
	if err := e.register(ctx, b, s); err != nil {
		return nil, err
	}
	return s.readerGone, nil
}

// register adds s to the shared feed, opening it if none is open, and
// waits until the feed is open (or ctx ends: s is ended then).
func (e *Elections) register(ctx context.Context, b *electionBackend, s *feedSub) error {
	cancel := s.end
	e.mu.Lock()
	if e.closed.Load() {
		e.mu.Unlock()
		cancel()
		return fmt.Errorf("leaderfeed: election %q: %w", b.name, ErrClosed)
	}
	sf := e.feed
	if sf == nil {
		fctx, fcancel := context.WithCancel(e.ctx)
		sf = &sharedFeed{e: e, cancel: fcancel, ready: make(chan struct{}),
			byName: make(map[string][]*feedSub), all: make(map[*feedSub]struct{})}
		e.feed = sf
		e.wg.Add(1)
		go sf.open(fctx)
	}
	// The subscription ends when its reader's ctx ends or the reader took
	// the Failed notification; then it leaves the feed and b. Both are
	// set before anyone else can see s.
	s.onEnd = func() {
		e.mu.Lock()
		delete(sf.all, s)
		subs := sf.byName[b.name]
		if i := slices.Index(subs, s); i >= 0 {
			subs = slices.Delete(subs, i, i+1)
		}
		if len(subs) == 0 {
			delete(sf.byName, b.name)
		} else {
			sf.byName[b.name] = subs
		}
		e.mu.Unlock()
		b.mu.Lock()
		if i := slices.Index(b.subs, s); i >= 0 {
			b.subs = slices.Delete(b.subs, i, i+1)
		}
		b.mu.Unlock()
	}
	s.open()
	sf.byName[b.name] = append(sf.byName[b.name], s)
	sf.all[s] = struct{}{}
	failErr := sf.failErr // dead already
	e.mu.Unlock()
	b.mu.Lock()
	closed := b.closed
	if !s.isEnded() {
		// (An ended s left b already, or will not find itself in b: it
		// leaves b under b.mu after it ended.)
		b.subs = append(b.subs, s)
	}
	b.mu.Unlock()
	if closed {
		s.fail(fmt.Errorf("leaderfeed: election %q: %w", b.name, ErrClosed))
	} else if failErr != nil {
		s.fail(failErr)
	}
	select {
	case <-sf.ready:
	case <-ctx.Done():
		cancel()
		return ctx.Err()
	}
	if sf.err != nil {
		cancel()
		return sf.err
	}
	return nil
}

func (sf *sharedFeed) open(ctx context.Context) {
	e := sf.e
	defer e.wg.Done()
	if fs, ok := e.store.(backend.FuncSubscriber); ok {
		sf.openFunc(ctx, fs)
		return
	}
	ch, err := e.store.Subscribe(ctx)
	if err != nil {
		sf.openFailed(err)
		return
	}
	close(sf.ready)
	for {
		select {
		case n, ok := <-ch:
			if !ok {
				err := errors.New("leaderfeed: changefeed closed without an error")
				if ctx.Err() != nil {
					err = fmt.Errorf("leaderfeed: changefeed: %w", ErrClosed)
				}
				sf.fail(err)
				return
			}
			if n.Type == backend.Failed {
				sf.fail(failure(n))
				drain(ch)
				return
			}
			sf.deliver(n)
		case <-ctx.Done():
			sf.fail(fmt.Errorf("leaderfeed: changefeed: %w", ErrClosed))
			drain(ch)
			return
		}
	}
}

// openFunc is open on a store whose changefeed calls a function: the
// notifications are dispatched on the store's goroutine, one hop fewer to
// the engines; this goroutine only waits for the feed's end to cancel it.
func (sf *sharedFeed) openFunc(ctx context.Context, fs backend.FuncSubscriber) {
	cancel, err := fs.SubscribeFunc(ctx, func(n backend.Notification) {
		if n.Type == backend.Failed {
			sf.fail(failure(n))
			return
		}
		sf.deliver(n)
	})
	if err != nil {
		sf.openFailed(err)
		return
	}
	close(sf.ready)
	<-ctx.Done() // the Elections closes, or fail cancelled it
	cancel()
	sf.fail(fmt.Errorf("leaderfeed: changefeed: %w", ErrClosed))
}

// openFailed ends a feed whose Subscribe failed with err.
func (sf *sharedFeed) openFailed(err error) {
	e := sf.e
	e.mu.Lock()
	sf.err, sf.dead, sf.failErr = err, true, err
	if e.feed == sf {
		e.feed = nil
	}
	e.mu.Unlock()
	sf.cancel()
	close(sf.ready)
}

// failure is the error of a Failed notification.
func failure(n backend.Notification) error {
	if n.Err == nil {
		return errors.New("leaderfeed: changefeed failed")
	}
	return n.Err
}

// drain reads ch until the store closes it, so that its sender ends.
func drain(ch <-chan backend.Notification) {
	for range ch {
	}
}

// deliver dispatches n, then lets the engine steps it queued run first
// (mailbox.Runner.Hand): the feed has nothing else to do until the next
// notification, and a goroutine started for a step would otherwise wait
// until this one blocks or another thread wakes to steal it.
func (sf *sharedFeed) deliver(n backend.Notification) {
	sf.e.run.Hand(func() { sf.dispatch(n) })
}

// dispatch queues n on the subscriptions it concerns; it never blocks.
func (sf *sharedFeed) dispatch(n backend.Notification) {
	e := sf.e
	e.mu.Lock()
	defer e.mu.Unlock()
	if n.Type == backend.OtherChanged {
		for s := range sf.all {
			s.push(n)
		}
		return
	}
	name := noteElection(n)
	if name == "" {
		e.log.Debug("leaderfeed: changefeed: notification of no election dropped", "type", n.Type.String())
		return
	}
	for _, s := range sf.byName[name] {
		s.push(n)
	}
}

// fail ends the shared feed: every subscription gets err as its last
// notification, and the next Subscribe opens a new feed.
func (sf *sharedFeed) fail(err error) {
	e := sf.e
	e.mu.Lock()
	if sf.dead {
		e.mu.Unlock()
		return
	}
	sf.dead, sf.failErr = true, err
	if e.feed == sf {
		e.feed = nil
	}
	subs := make([]*feedSub, 0, len(sf.all))
	for s := range sf.all {
		subs = append(subs, s)
	}
	e.mu.Unlock()
	sf.cancel()
	for _, s := range subs {
		s.fail(err)
	}
	e.log.Info("leaderfeed: changefeed ended", "err", err)
}

// feedSub is one election's subscription on the shared feed: a Pipe to
// the reader's channel (subscribe), or a function the feed calls in order
// (SubscribeFunc). Notifications of the election record are coalesced in
// the pipe: a newer one replaces those not yet taken, so the reader gets
// the latest state: a reader that lags sees at most two older records
// before the latest (one in the channel, one being sent). A reader that lets
// maxFeedQueue other changes wait gets Failed instead of them.
type feedSub struct {
	ctx    context.Context // the reader's (subscribe)
	cancel context.CancelFunc
	name   string
	pipe   *mailbox.Pipe[backend.Notification] // set by register (subscribe)
	to     func(backend.Notification)          // instead of pipe (SubscribeFunc)
	onEnd  func()                              // leaves the feed; set before the first push

	mu    sync.Mutex // of to
	ended bool       // to got Failed, or the subscription was cancelled
}

func newFeedSub(ctx context.Context, cancel context.CancelFunc, b *electionBackend) *feedSub {
	return &feedSub{ctx: ctx, cancel: cancel, name: b.name}
}

// open makes the pipe of a channel subscription, once onEnd is set.
func (s *feedSub) open() {
	if s.ctx != nil {
		s.pipe = mailbox.NewPipe[backend.Notification](s.ctx, 1, func() { s.cancel(); s.onEnd() })
	}
}

// push hands n to the reader; it never blocks.
func (s *feedSub) push(n backend.Notification) {
	if s.pipe != nil {
		if s.pipe.Len() >= maxFeedQueue {
			s.pipe.End(backend.Notification{Type: backend.Failed, Err: fmt.Errorf("leaderfeed: changefeed of election %q fell %d notifications behind", s.name, maxFeedQueue)}, true)
			return
		}
		var stale func(backend.Notification) bool
		if n.Type != backend.OtherChanged {
			stale = func(q backend.Notification) bool { return q.Type != backend.OtherChanged }
		}
		s.pipe.Replace(n, stale)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ended {
		s.to(n)
	}
}

// fail ends the subscription after what is queued: Failed with err is the
// last notification.
func (s *feedSub) fail(err error) {
	failed := backend.Notification{Type: backend.Failed, Err: err}
	if s.pipe != nil {
		s.pipe.End(failed, false)
		return
	}
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return
	}
	s.to(failed)
	s.ended = true
	s.mu.Unlock()
	s.onEnd()
}

// isEnded reports whether the subscription has ended (onEnd ran, or runs).
func (s *feedSub) isEnded() bool {
	if s.pipe != nil {
		return s.pipe.Closed()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ended
}

// end ends the subscription for its reader: by its context, or at once
// for one of SubscribeFunc, which has none.
func (s *feedSub) end() {
	if s.cancel != nil {
		s.cancel()
		return
	}
	s.readerGone()
}

// readerGone ends a subscription of SubscribeFunc: nothing more is handed
// to it, and it leaves the feed.
func (s *feedSub) readerGone() {
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return
	}
	s.ended = true
	s.mu.Unlock()
	s.onEnd()
}

// ---- batched writes ----

// maxInFlight bounds the batches of writes, and those of reads, that one
// Elections has in flight at once. A batch in flight never holds up the
// next one (a hung write costs the other elections nothing) until this
// many hang at once; it is also about the connections a database client
// gives one process.
const maxInFlight = 8

// flights runs the batches of a batcher each on a goroutine of its own,
// at most maxInFlight at once; Elections.Close waits for them (e.wg).
type flights struct {
	e     *Elections
	slots chan struct{}
}

func newFlights(e *Elections) *flights {
	return &flights{e: e, slots: make(chan struct{}, maxInFlight)}
}

// slot returns the channel that takes a token when a batch may start.
func (f *flights) slot() chan<- struct{} { return f.slots }

// start runs send on its own goroutine; the caller holds a token.
func (f *flights) start(send func()) {
	f.e.wg.Add(1)
	go func() {
		defer f.e.wg.Done()
		defer func() { <-f.slots }()
		send()
	}()
}

// writeReq is one write waiting for a batch. It is answered exactly once
// (answer): by its batch's result, or with its context's error when its
// deadline passes first, whatever its batch still does (send), or with
// ErrClosed. done must not block: it hands the result to the waiter (a
// channel with room, or the Feed's loop without a goroutine,
// SubmitHeartbeat, whose function it is).
type writeReq struct {
	ctx      context.Context // the caller's: a request whose ctx ended is answered, not sent
	deadline time.Time       // the caller's deadline; zero: none
	w        backend.Write
	arrived  time.Time
	flush    time.Time // send by then: arrived for claims and vacancies
	window   time.Duration
	done     func(heartbeat.Record, error)

	// state is nil while the request waits, the batchCall of its batch
	// once in flight (send), answered once answered: one word, so that a
	// request fits the allocator's 384-byte class.
	state atomic.Pointer[batchCall]
}

// answered is the state of an answered writeReq.
var answered = new(batchCall)

// answer hands res to the waiter, unless the request was answered
// already, and counts the answer in the batch in flight, if any.
func (r *writeReq) answer(res backend.WriteResult) {
	for {
		c := r.state.Load()
		if c == answered {
			return
		}
		if r.state.CompareAndSwap(c, answered) { // fails only if send set c meanwhile, or another answered
			r.done(res.Record, res.Err)
			if c != nil {
				c.answered()
			}
			return
		}
	}
}

// batchCall is the store call of a batch of several writes: it ends (its
// context is cancelled) once every write in it has been answered, whoever
// answered it, so that a hung store keeps no slot (maxInFlight) for writes
// nobody waits for.
type batchCall struct {
	left   atomic.Int64 // writes not yet answered
	cancel context.CancelFunc
}

// newBatchCall returns the call of batch, counting each write's answer
// once: answer counts those answered after this (it finds the call in
// their state), this counts those answered before (it finds answered).
func newBatchCall(batch []*writeReq, cancel context.CancelFunc) *batchCall {
	c := &batchCall{cancel: cancel}
	c.left.Store(int64(len(batch)))
	for _, r := range batch {
		if !r.state.CompareAndSwap(nil, c) {
			c.answered()
		}
	}
	return c
}

// answered counts one write answered; the last one ends the call.
func (c *batchCall) answered() {
	if c.left.Add(-1) == 0 {
		c.cancel()
	}
}

// expired reports the error of a request that must not be sent any more.
func (r *writeReq) expired(now time.Time) error {
	if r.state.Load() == answered {
		return context.Canceled
	}
	if err := r.ctx.Err(); err != nil {
		return err
	}
	if !r.deadline.IsZero() && !now.Before(r.deadline) {
		return context.DeadlineExceeded
	}
	return nil
}

// isRenewal reports whether w writes again the record it expects: same
// leader and term.
func isRenewal(w backend.Write) bool {
	return w.Next.Leader != "" && w.Next.Leader == w.Expected.Leader && w.Next.Term == w.Expected.Term
}

// newWriteReq returns the request of a write; a renewal may wait up to
// window for others.
func newWriteReq(ctx context.Context, deadline time.Time, w backend.Write, window time.Duration, done func(heartbeat.Record, error)) *writeReq {
	now := time.Now()
	r := &writeReq{ctx: ctx, deadline: deadline, w: w, arrived: now, flush: now, done: done}
	if isRenewal(w) {
		r.flush, r.window = now.Add(window), window
	}
	return r
}

// window returns how long a renewal of b waits for the renewals of others.
func (b *electionBackend) window() time.Duration {
	if b.e.window > 0 {
		return b.e.window
	}
	return max(time.Millisecond, time.Duration(b.interval.Load())/batchWindowDivisor)
}

// write sends one write through the batcher and waits for its result.
func (e *Elections) write(ctx context.Context, w backend.Write, window time.Duration) (heartbeat.Record, error) {
	reply := make(chan backend.WriteResult, 1)
	deadline, _ := ctx.Deadline()
	r := newWriteReq(ctx, deadline, w, window, func(rec heartbeat.Record, err error) { reply <- backend.WriteResult{Record: rec, Err: err} })
	e.writes.put(r)
	select {
	case res := <-reply:
		return res.Record, res.Err
	case <-ctx.Done():
		r.answer(backend.WriteResult{Err: ctx.Err()})
		return heartbeat.Record{}, ctx.Err()
	case <-e.ctx.Done():
		// Closed: the write may or may not have been sent.
		r.answer(backend.WriteResult{Err: ErrClosed})
		return heartbeat.Record{}, fmt.Errorf("leaderfeed: election %q: %w", w.Next.Election, ErrClosed)
	}
}

// SubmitHeartbeat hands a claim or renewal to the batcher without waiting
// and without a goroutine (backend.Submitter). It reports false when the
// write is not batched; the caller then calls Heartbeat as usual.
func (b *electionBackend) SubmitHeartbeat(ctx context.Context, deadline time.Time, expected, next heartbeat.Record, done func(heartbeat.Record, error)) bool {
	if b.e.batch == nil || b.observer || next.Election != b.name {
		return false
	}
	if err := b.check(ctx); err != nil {
		done(heartbeat.Record{}, err)
		return true
	}
	b.e.writes.put(newWriteReq(ctx, deadline, backend.Write{Expected: expected, Next: next}, b.window(), done))
	return true
}

// writeQueue is the batcher's inbox. Writes wait in it without bound (each
// election has at most one in flight), and the batcher is woken only when
// it must look: it waits for a first write, or one must be sent before the
// batch is due (a claim or vacancy, a renewal of a shorter window), or a
// batch's worth waits; else it takes them all when the batch is due. A
// channel woke it for every write: thousands of wake-ups per batch.
type writeQueue struct {
	wake chan struct{} // room for one: look

	mu     sync.Mutex
	q      []*writeReq // q[head:] wait
	head   int
	idle   bool      // the batcher waits for any write
	room   int       // the batcher waits for this many (its batch's room)
	due    time.Time // the batcher waits for a write to send before this
	closed error     // set by close: later writes are answered with it
}

func newWriteQueue() *writeQueue {
	return &writeQueue{wake: make(chan struct{}, 1)}
}

// put queues r; it never blocks.
func (w *writeQueue) put(r *writeReq) {
	w.mu.Lock()
	if err := w.closed; err != nil {
		w.mu.Unlock()
		r.answer(backend.WriteResult{Err: err})
		return
	}
	w.q = append(w.q, r)
	look := w.idle || r.window <= 0 || r.flush.Before(w.due) || len(w.q)-w.head >= w.room
	w.idle = false
	w.mu.Unlock()
	if look {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// expect says when put wakes the batcher: at the first write (idle), or
// for a write to send before due, or once room writes wait; claims and
// vacancies always wake it.
func (w *writeQueue) expect(idle bool, room int, due time.Time) {
	w.mu.Lock()
	w.idle, w.room, w.due = idle, room, due
	w.mu.Unlock()
}

// take appends up to n waiting writes to pending.
func (w *writeQueue) take(pending []*writeReq, n int) []*writeReq {
	w.mu.Lock()
	defer w.mu.Unlock()
	n = min(n, len(w.q)-w.head)
	pending = append(pending, w.q[w.head:w.head+n]...)
	clear(w.q[w.head : w.head+n])
	w.head += n
	if w.head == len(w.q) {
		w.q, w.head = w.q[:0], 0
		if cap(w.q) > 1024 {
			w.q = nil
		}
	}
	return pending
}

// close answers the waiting writes, and every later one, with err.
func (w *writeQueue) close(err error) {
	w.mu.Lock()
	w.closed = err
	left := w.q[w.head:]
	w.q, w.head = nil, 0
	w.mu.Unlock()
	for _, r := range left {
		r.answer(backend.WriteResult{Err: err})
	}
}

// batcher collects writes and sends them in batches: at once when a claim
// or vacancy is waiting, else when a renewal has waited its window. Each
// batch is sent on a goroutine of its own (flights), so that a batch in
// flight never holds up the next, nor a write that hangs another
// election's; while maxInFlight batches are in flight the next one keeps
// gathering (group commit).
//
// Renewals of elections with one heartbeat interval fall due at one
// instant (AlignRenewal), but the Feeds of thousands of elections take
// a while to wake and hand them over, longer on a loaded machine. So a
// batch of renewals only keeps waiting past its window while renewals
// keep coming (the last came less than half a window ago, the smallest
// window of the batch), and never past three windows of any of its
// renewals: one batch carries the renewals of one instant, and a renewal
// spends at most three of its own windows of its lease's margin here,
// whatever the timings of the others in its batch.
func (e *Elections) batcher() {
	defer e.wg.Done()
	fl := newFlights(e)
	var pending []*writeReq
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	wq := e.writes
	for {
		if len(pending) == 0 {
			wq.expect(true, 1, time.Time{})
			if pending = wq.take(pending, e.maxBatch); len(pending) == 0 {
				select {
				case <-wq.wake:
					continue
				case <-e.ctx.Done():
					e.failWrites(nil)
					return
				}
			}
		}
		g := newGather(pending)
		var slot chan<- struct{} // set once the batch is due: a token starts it
		var expire *time.Timer   // while waiting for a slot: the earliest deadline
	gather:
		for {
			// Take what waits, up to the batch's room; wake for more only
			// if they fill it or one must go before the batch is due.
			var wake <-chan struct{}
			if room := e.maxBatch - len(pending); room > 0 {
				n := len(pending)
				pending = wq.take(pending, room)
				for _, r := range pending[n:] {
					g.add(r)
				}
				wq.expect(false, e.maxBatch-len(pending), g.flushAt)
				n = len(pending)
				pending = wq.take(pending, e.maxBatch-len(pending)) // came meanwhile
				for _, r := range pending[n:] {
					g.add(r)
				}
				wake = wq.wake
			}
			var timeout <-chan time.Time
			if slot == nil {
				d := time.Until(g.flushAt)
				if d <= 0 || len(pending) >= e.maxBatch {
					if len(pending) < e.maxBatch && g.extend(time.Now()) {
						continue
					}
					select {
					case fl.slot() <- struct{}{}:
						break gather
					default:
					}
					// maxInFlight batches are in flight: keep gathering
					// until one ends, answering the writes whose deadline
					// passes meanwhile.
					slot = fl.slot()
					continue
				}
				timer.Reset(d)
				timeout = timer.C
			}
			var expired <-chan time.Time
			if slot != nil {
				pending = answerExpired(pending, time.Now())
				if at := earliestDeadline(pending); !at.IsZero() {
					if expire == nil {
						expire = time.NewTimer(time.Until(at))
					} else {
						expire.Reset(time.Until(at))
					}
					expired = expire.C
				}
			}
			select {
			case <-wake:
			case <-timeout:
			case <-expired:
			case slot <- struct{}{}:
				break gather
			case <-e.ctx.Done():
				timer.Stop()
				e.failWrites(pending)
				return
			}
			timer.Stop()
		}
		if expire != nil {
			expire.Stop()
		}
		batch := slices.Clone(answerExpired(pending, time.Now()))
		clear(pending)
		pending = pending[:0]
		fl.start(func() { e.send(batch) })
	}
}

// answerExpired answers the writes of pending whose context ended or whose
// deadline passed, and returns the others.
func answerExpired(pending []*writeReq, now time.Time) []*writeReq {
	kept := pending[:0]
	for _, r := range pending {
		if err := r.expired(now); err != nil {
			r.answer(backend.WriteResult{Err: err})
		} else {
			kept = append(kept, r)
		}
	}
	clear(pending[len(kept):])
	return kept
}

// earliestDeadline returns the earliest deadline of writes; zero: none.
func earliestDeadline(writes []*writeReq) time.Time {
	var at time.Time
	for _, r := range writes {
		if !r.deadline.IsZero() && (at.IsZero() || r.deadline.Before(at)) {
			at = r.deadline
		}
	}
	return at
}

// gather is when the batch being gathered is sent.
type gather struct {
	flushAt time.Time // the earliest flush of its writes, or later (extend)
	urgent  bool      // it holds a claim or vacancy: never extended
	last    time.Time // when its last write arrived
	quiet   time.Duration
	limit   time.Time // extend never goes past it
}

func newGather(pending []*writeReq) *gather {
	g := &gather{}
	for _, r := range pending {
		g.add(r)
	}
	return g
}

func (g *gather) add(r *writeReq) {
	if g.flushAt.IsZero() || r.flush.Before(g.flushAt) {
		g.flushAt = r.flush
	}
	if r.window <= 0 {
		g.urgent = true
	} else {
		// The batch keeps gathering by the strictest renewal's timing.
		if g.quiet == 0 || r.window/2 < g.quiet {
			g.quiet = r.window / 2
		}
		if l := r.arrived.Add(3 * r.window); g.limit.IsZero() || l.Before(g.limit) {
			g.limit = l
		}
	}
	if r.arrived.After(g.last) {
		g.last = r.arrived
	}
}

// extend moves flushAt on, and reports true, when the batch is due but
// renewals are still coming in.
func (g *gather) extend(now time.Time) bool {
	if g.urgent || g.quiet <= 0 || !now.Before(g.limit) || now.Sub(g.last) >= g.quiet {
		return false
	}
	g.flushAt = g.last.Add(g.quiet)
	if g.flushAt.After(g.limit) {
		g.flushAt = g.limit
	}
	return true
}

// send writes one batch and hands out the results. The batch lasts as
// long as its most patient write allows, and no longer than some write
// waits for it: a write alone ends with its context, several once each
// has been answered (batchCall). Each write is answered at its own
// deadline if the batch takes longer (one timer, at the earliest deadline
// not yet passed).
func (e *Elections) send(batch []*writeReq) {
	if len(batch) == 0 {
		return
	}
	stop := sweepDeadlines(batch)
	defer stop()
	var deadline time.Time
	bounded := true
	for _, r := range batch {
		if r.deadline.IsZero() {
			bounded = false
		} else if r.deadline.After(deadline) {
			deadline = r.deadline
		}
	}
	var ctx context.Context
	var cancel context.CancelFunc
	if bounded {
		ctx, cancel = context.WithDeadline(e.ctx, deadline)
	} else {
		ctx, cancel = context.WithCancel(e.ctx)
	}
	defer cancel()
	if len(batch) == 1 {
		r := batch[0]
		// A write alone ends with its own context too.
		stop := context.AfterFunc(r.ctx, cancel)
		rec, err := e.store.Heartbeat(ctx, r.w.Expected, r.w.Next)
		stop()
		r.answer(backend.WriteResult{Record: rec, Err: err})
		return
	}
	// The record rules are checked here once for every store: a write that
	// breaks them, or names an election a write before it names, fails
	// alone and is not sent (stores check them all the same, with their
	// own integer range).
	seen := make(heartbeat.Batch, len(batch))
	sent := batch[:0:0]
	for i, r := range batch {
		err := heartbeat.ValidateWrite(r.w.Expected, r.w.Next, math.MaxInt64)
		if err == nil {
			err = seen.Add(r.w.Next.Election, i)
		}
		if err != nil {
			r.answer(backend.WriteResult{Err: fmt.Errorf("leaderfeed: election %q: %w: %w", r.w.Next.Election, ErrInvalidConfig, err)})
			continue
		}
		sent = append(sent, r)
	}
	if batch = sent; len(batch) == 0 {
		return
	}
	writes := make([]backend.Write, len(batch))
	for i, r := range batch {
		writes[i] = r.w
	}
	newBatchCall(batch, cancel)
	results, err := e.batch.HeartbeatBatch(ctx, writes)
	if err == nil && len(results) != len(batch) {
		err = fmt.Errorf("leaderfeed: store returned %d results for a batch of %d writes", len(results), len(batch))
	}
	for i, r := range batch {
		if err != nil {
			r.answer(backend.WriteResult{Err: err})
		} else {
			r.answer(results[i])
		}
	}
}

// sweepDeadlines answers each write of batch at its deadline, with
// context.DeadlineExceeded, unless it was answered before; stop ends it.
func sweepDeadlines(batch []*writeReq) (stop func()) {
	byDeadline := make([]*writeReq, 0, len(batch))
	for _, r := range batch {
		if !r.deadline.IsZero() {
			byDeadline = append(byDeadline, r)
		}
	}
	if len(byDeadline) == 0 {
		return func() {}
	}
	slices.SortFunc(byDeadline, func(a, b *writeReq) int { return a.deadline.Compare(b.deadline) })
	var mu sync.Mutex
	stopped := false
	var t *time.Timer
	sweep := func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		now := time.Now()
		for len(byDeadline) > 0 && !now.Before(byDeadline[0].deadline) {
			byDeadline[0].answer(backend.WriteResult{Err: context.DeadlineExceeded})
			byDeadline = byDeadline[1:]
		}
		if len(byDeadline) > 0 {
			t.Reset(time.Until(byDeadline[0].deadline))
		}
	}
	mu.Lock()
	t = time.AfterFunc(time.Until(byDeadline[0].deadline), sweep)
	mu.Unlock()
	return func() {
		mu.Lock()
		stopped = true
		t.Stop()
		mu.Unlock()
	}
}

func (e *Elections) failWrites(pending []*writeReq) {
	err := fmt.Errorf("leaderfeed: elections: %w", ErrClosed)
	for _, r := range pending {
		r.answer(backend.WriteResult{Err: err})
	}
	e.writes.close(err)
}

// noteElection returns the election n is about, "" for OtherChanged and
// Failed.
func noteElection(n backend.Notification) string {
	switch n.Type {
	case backend.RecordChanged:
		return n.Record.Election
	case backend.RecordDeleted, backend.Ignored:
		if n.Election != "" {
			return n.Election
		}
		return n.Record.Election
	}
	return ""
}
