package base

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// Defaults of ElectionsOptions.
const (
	// DefaultMaxBatch is the default of ElectionsOptions.MaxBatch.
	DefaultMaxBatch = 5000
	// BatchWindowDivisor: by default a renewal waits a twentieth of its
	// heartbeat interval for the renewals of other elections (50 ms with
	// the default timing), a small part of the lease's margin.
	BatchWindowDivisor = 20
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
	// NoBatch turns batching off even when the Store is a BatchStore:
	// every write is a compare-and-set of its own.
	NoBatch bool
	// MaxBatch bounds the writes of one batch. Default DefaultMaxBatch.
	MaxBatch int
	// BatchWindow is how long a renewal waits for the renewals of other
	// elections before their batch is sent. Claims and vacancies never
	// wait for one. Renewals of elections with the same HeartbeatInterval
	// are due at the same instants (the Feeds renew a little early to
	// that end), so one batch a window carries them all, however long the
	// goroutines of thousands of elections take to wake. The lease runs
	// from the time the Feed handed the renewal over, so the window only
	// spends a little of the lease's margin. Default: the heartbeat
	// interval divided by BatchWindowDivisor.
	BatchWindow time.Duration
}

// Elections shares one Store among the elections of a process: the Store
// is started and created once, its one changefeed serves every election
// (the notifications of each are queued and coalesced here, once for all
// backends), and, when the Store is a BatchStore, the renewals of all
// elections due at the same time are written in one batch. Backend returns
// the Backend of one election, for a Feed.
//
// Elections owns the Store: Close closes it. Its methods are safe for
// concurrent use.
type Elections struct {
	store    Store
	batch    BatchStore // nil: no batching
	log      *slog.Logger
	maxBatch int
	window   time.Duration
	epoch    time.Time // origin of the renewal grid
	ctx      context.Context
	cancel   context.CancelFunc
	owned    bool // made by Open: closing its one Backend closes it
	wg       sync.WaitGroup
	writes   chan *writeReq

	started, created onceCall

	mu     sync.Mutex
	closed bool
	open   map[string]*electionBackend
	feed   *sharedFeed // open or opening; nil when none
}

// NewElections returns an Elections on s. It does no I/O.
func NewElections(s Store, opts ElectionsOptions) (*Elections, error) {
	if s == nil {
		return nil, fmt.Errorf("%w: store is nil", ErrInvalidConfig)
	}
	if opts.MaxBatch < 0 || opts.BatchWindow < 0 {
		return nil, fmt.Errorf("%w: MaxBatch (%d) and BatchWindow (%v) must not be negative", ErrInvalidConfig, opts.MaxBatch, opts.BatchWindow)
	}
	if opts.MaxBatch == 0 {
		opts.MaxBatch = DefaultMaxBatch
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
	}
	if bs, ok := s.(BatchStore); ok && !opts.NoBatch {
		e.batch = bs
		e.writes = make(chan *writeReq, opts.MaxBatch)
		e.wg.Add(1)
		go e.batcher()
	}
	return e, nil
}

// Open returns the Backend of one election on s, for a process with one
// election: it owns s, and closing the Backend (which the Feed does when it
// stops) closes s. Writes are not batched.
func Open(s Store, election string) (Backend, error) {
	e, err := NewElections(s, ElectionsOptions{NoBatch: true})
	if err != nil {
		return nil, err
	}
	e.owned = true
	b, err := e.Backend(election)
	if err != nil {
		_ = e.Close()
		return nil, err
	}
	return b, nil
}

// Backend returns the Backend of election, for one Feed. An election can
// have one open Backend per Elections: a second one fails with an error
// matching ErrInvalidConfig until the first is closed (nodes of one
// election in one process, as in tests, each need an Elections, and a
// Store, of their own). A closed Elections fails with ErrClosed.
func (e *Elections) Backend(election string) (Backend, error) {
	return e.newBackend(election, false)
}

// Observer returns a Backend of election for an observe-only Feed
// (Options.ObserveOnly): any number of them may be open on one Elections,
// beside the one Backend that campaigns, and all share the one changefeed.
// Its Heartbeat fails with an error matching ErrObserveOnly.
func (e *Elections) Observer(election string) (Backend, error) {
	return e.newBackend(election, true)
}

func (e *Elections) newBackend(election string, observer bool) (Backend, error) {
	if err := heartbeat.ValidateName("election name", election); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, fmt.Errorf("leaderfeed: election %q: %w", election, ErrClosed)
	}
	b := &electionBackend{e: e, name: election, observer: observer, subs: make(map[*feedSub]struct{})}
	if observer {
		return b, nil
	}
	if _, ok := e.open[election]; ok {
		return nil, fmt.Errorf("%w: election %q is open on this Elections already (one Backend per election; close it first)", ErrInvalidConfig, election)
	}
	e.open[election] = b
	return b, nil
}

// Feed returns a Feed for node nodeID in election: New on Backend(election),
// or on Observer(election) when opts.ObserveOnly is set.
func (e *Elections) Feed(election, nodeID string, opts Options) (*Feed, error) {
	open := e.Backend
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
// nothing until stopped. Close is idempotent.
func (e *Elections) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	sf := e.feed
	e.feed = nil
	e.mu.Unlock()
	e.cancel()
	if sf != nil {
		sf.fail(fmt.Errorf("leaderfeed: elections: %w", ErrClosed))
	}
	e.wg.Wait()
	return e.store.Close()
}

func (e *Elections) isClosed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.closed
}

// ---- one election's Backend ----

// electionBackend is the Backend of one election on an Elections.
type electionBackend struct {
	e        *Elections
	name     string
	observer bool         // made by Observer: writes nothing
	interval atomic.Int64 // the Feed's heartbeat interval, from AlignRenewal

	mu     sync.Mutex
	closed bool
	subs   map[*feedSub]struct{}
}

func (b *electionBackend) Election() string { return b.name }

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
	return b.e.store.Get(ctx, b.name)
}

func (b *electionBackend) Heartbeat(ctx context.Context, expected, next heartbeat.Record) (heartbeat.Record, error) {
	if err := b.check(ctx); err != nil {
		return heartbeat.Record{}, err
	}
	if next.Election == "" {
		next.Election = b.name
	}
	if next.Election != b.name {
		return heartbeat.Record{}, fmt.Errorf("%w: %w: the Backend of election %q was given a record of election %q",
			ErrInvalidConfig, heartbeat.ErrInvalidRecord, b.name, next.Election)
	}
	if b.observer {
		return heartbeat.Record{}, fmt.Errorf("leaderfeed: election %q: an Observer backend writes nothing: %w", b.name, ErrObserveOnly)
	}
	if b.e.batch == nil {
		return b.e.store.Heartbeat(ctx, expected, next)
	}
	window := b.e.window
	if window == 0 {
		window = max(time.Millisecond, time.Duration(b.interval.Load())/BatchWindowDivisor)
	}
	return b.e.write(ctx, Write{Expected: expected, Next: next}, window)
}

// AlignRenewal returns when a renewal due at due is sent: the latest
// instant of a grid of half a heartbeat interval at or before due, when
// writes are batched, so that the renewals of every election with that
// interval fall on the same instants and share batches. Renewing early is
// safe: a lease runs from its renewal's send time.
func (b *electionBackend) AlignRenewal(due time.Time, interval time.Duration) time.Time {
	step := interval / 2
	if b.e.batch == nil || step <= 0 {
		return due
	}
	b.interval.Store(int64(interval))
	k := due.Sub(b.e.epoch) / step
	return b.e.epoch.Add(k * step)
}

func (b *electionBackend) Subscribe(ctx context.Context) (<-chan Notification, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	return b.e.subscribe(ctx, b)
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
	subs := make([]*feedSub, 0, len(b.subs))
	for s := range b.subs {
		subs = append(subs, s)
	}
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
	byName  map[string]map[*feedSub]struct{}
	all     map[*feedSub]struct{}
	failErr error
}

// subscribe returns a changefeed of b's election on the shared feed,
// opening the feed if none is open. The subscription is registered before
// the feed opens (or at once on an open feed), so that nothing the feed
// delivers after it listens is lost: a store that replays what it missed
// (a resumed MongoDB change stream) replays it to every subscriber.
func (e *Elections) subscribe(ctx context.Context, b *electionBackend) (<-chan Notification, error) {
	sctx, cancel := context.WithCancel(ctx)
	s := newFeedSub(sctx, cancel, b)
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		cancel()
		return nil, fmt.Errorf("leaderfeed: election %q: %w", b.name, ErrClosed)
	}
	sf := e.feed
	if sf == nil {
		fctx, fcancel := context.WithCancel(e.ctx)
		sf = &sharedFeed{e: e, cancel: fcancel, ready: make(chan struct{}),
			byName: make(map[string]map[*feedSub]struct{}), all: make(map[*feedSub]struct{})}
		e.feed = sf
		e.wg.Add(1)
		go sf.open(fctx)
	}
	if sf.byName[b.name] == nil {
		sf.byName[b.name] = make(map[*feedSub]struct{})
	}
	sf.byName[b.name][s] = struct{}{}
	sf.all[s] = struct{}{}
	if sf.dead {
		s.failErr = sf.failErr
	}
	e.mu.Unlock()
	b.mu.Lock()
	closed := b.closed
	b.subs[s] = struct{}{}
	b.mu.Unlock()
	if closed {
		s.fail(fmt.Errorf("leaderfeed: election %q: %w", b.name, ErrClosed))
	}
	// Not in e.wg: the goroutine ends when its reader's ctx ends or the
	// reader takes the Failed notification, and Close must not wait for a
	// reader.
	go func() {
		s.run()
		s.cancel()
		e.mu.Lock()
		delete(sf.all, s)
		if m := sf.byName[b.name]; m != nil {
			delete(m, s)
			if len(m) == 0 {
				delete(sf.byName, b.name)
			}
		}
		e.mu.Unlock()
		b.mu.Lock()
		delete(b.subs, s)
		b.mu.Unlock()
	}()
	select {
	case <-sf.ready:
	case <-ctx.Done():
		s.cancel()
		return nil, ctx.Err()
	}
	if sf.err != nil {
		s.cancel()
		return nil, sf.err
	}
	return s.out, nil
}

func (sf *sharedFeed) open(ctx context.Context) {
	e := sf.e
	defer e.wg.Done()
	ch, err := e.store.Subscribe(ctx)
	if err != nil {
		e.mu.Lock()
		sf.err, sf.dead, sf.failErr = err, true, err
		if e.feed == sf {
			e.feed = nil
		}
		e.mu.Unlock()
		sf.cancel()
		close(sf.ready)
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
			if n.Type == Failed {
				err := n.Err
				if err == nil {
					err = errors.New("leaderfeed: changefeed failed")
				}
				sf.fail(err)
				drain(ch)
				return
			}
			sf.dispatch(n)
		case <-ctx.Done():
			sf.fail(fmt.Errorf("leaderfeed: changefeed: %w", ErrClosed))
			drain(ch)
			return
		}
	}
}

// drain reads ch until the store closes it, so that its sender ends.
func drain(ch <-chan Notification) {
	for range ch {
	}
}

// dispatch queues n on the subscriptions it concerns; it never blocks.
func (sf *sharedFeed) dispatch(n Notification) {
	e := sf.e
	e.mu.Lock()
	defer e.mu.Unlock()
	if n.Type == OtherChanged {
		for s := range sf.all {
			s.push(n)
		}
		return
	}
	name := n.election()
	if name == "" {
		e.log.Debug("leaderfeed: changefeed: notification of no election dropped", "type", n.Type.String())
		return
	}
	for s := range sf.byName[name] {
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

// feedSub is one election's subscription on the shared feed: a queue the
// feed pushes on without blocking, and a goroutine that hands it to the
// reader. Notifications of the election record are coalesced: a newer one
// replaces those not yet taken, so the reader gets the latest state.
type feedSub struct {
	ctx    context.Context
	cancel context.CancelFunc
	name   string
	out    chan Notification
	signal chan struct{}

	mu      sync.Mutex
	queue   []Notification
	records int // notifications of the record in queue (0 or 1)
	failErr error
}

func newFeedSub(ctx context.Context, cancel context.CancelFunc, b *electionBackend) *feedSub {
	return &feedSub{ctx: ctx, cancel: cancel, name: b.name, out: make(chan Notification), signal: make(chan struct{}, 1)}
}

func (s *feedSub) poke() {
	select {
	case s.signal <- struct{}{}:
	default:
	}
}

func (s *feedSub) push(n Notification) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failErr != nil {
		return
	}
	if n.Type != OtherChanged && s.records > 0 {
		kept := s.queue[:0]
		for _, q := range s.queue {
			if q.Type == OtherChanged {
				kept = append(kept, q)
			}
		}
		clear(s.queue[len(kept):])
		s.queue, s.records = kept, 0
	}
	if len(s.queue) >= maxFeedQueue {
		s.failErr = fmt.Errorf("leaderfeed: changefeed of election %q fell %d notifications behind", s.name, maxFeedQueue)
		s.queue, s.records = nil, 0
	} else {
		s.queue = append(s.queue, n)
		if n.Type != OtherChanged {
			s.records++
		}
	}
	s.poke()
}

func (s *feedSub) fail(err error) {
	s.mu.Lock()
	if s.failErr == nil {
		s.failErr = err
	}
	s.mu.Unlock()
	s.poke()
}

// run hands the queue to the reader in order, then Failed if the feed
// failed, until the reader's ctx ends.
func (s *feedSub) run() {
	defer close(s.out)
	for {
		s.mu.Lock()
		var n Notification
		have := len(s.queue) > 0
		if have {
			n = s.queue[0]
			s.queue[0] = Notification{}
			s.queue = s.queue[1:]
			if n.Type != OtherChanged {
				s.records--
			}
		}
		failErr := s.failErr
		s.mu.Unlock()
		switch {
		case have:
			select {
			case s.out <- n:
			case <-s.ctx.Done():
				return
			}
		case failErr != nil:
			select {
			case s.out <- Notification{Type: Failed, Err: failErr}:
			case <-s.ctx.Done():
			}
			return
		default:
			select {
			case <-s.signal:
			case <-s.ctx.Done():
				return
			}
		}
	}
}

// ---- batched writes ----

type writeReq struct {
	ctx   context.Context
	w     Write
	flush time.Time        // send by then: now for claims and vacancies
	reply chan WriteResult // buffered: the batcher never blocks on it
}

// write sends one write through the batcher and waits for its result. A
// renewal waits up to window for others.
func (e *Elections) write(ctx context.Context, w Write, window time.Duration) (heartbeat.Record, error) {
	// A renewal writes the record it holds again: same leader and term.
	renewal := w.Next.Leader != "" && w.Next.Leader == w.Expected.Leader && w.Next.Term == w.Expected.Term
	r := &writeReq{ctx: ctx, w: w, flush: time.Now(), reply: make(chan WriteResult, 1)}
	if renewal {
		r.flush = r.flush.Add(window)
	}
	select {
	case e.writes <- r:
	case <-ctx.Done():
		return heartbeat.Record{}, ctx.Err()
	case <-e.ctx.Done():
		return heartbeat.Record{}, fmt.Errorf("leaderfeed: election %q: %w", w.Next.Election, ErrClosed)
	}
	select {
	case res := <-r.reply:
		return res.Record, res.Err
	case <-ctx.Done():
		return heartbeat.Record{}, ctx.Err()
	case <-e.ctx.Done():
		// Closed: the write may or may not have been sent.
		return heartbeat.Record{}, fmt.Errorf("leaderfeed: election %q: %w", w.Next.Election, ErrClosed)
	}
}

// batcher collects writes and sends them in batches: at once when a claim
// or vacancy is waiting, else when the oldest renewal has waited the
// window; while a batch is in flight the next one gathers (group commit).
func (e *Elections) batcher() {
	defer e.wg.Done()
	var pending []*writeReq
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		if len(pending) == 0 {
			select {
			case r := <-e.writes:
				pending = append(pending, r)
			case <-e.ctx.Done():
				e.failWrites(nil)
				return
			}
		}
		flushAt := e.flushAt(pending)
	gather:
		for len(pending) < e.maxBatch {
			d := time.Until(flushAt)
			if d <= 0 {
				// Take what is queued already, without waiting.
				select {
				case r := <-e.writes:
					pending = append(pending, r)
					continue
				default:
					break gather
				}
			}
			timer.Reset(d)
			select {
			case r := <-e.writes:
				pending = append(pending, r)
				if at := e.flushAt([]*writeReq{r}); at.Before(flushAt) {
					flushAt = at
				}
			case <-timer.C:
			case <-e.ctx.Done():
				timer.Stop()
				e.failWrites(pending)
				return
			}
			timer.Stop()
		}
		batch := pending[:0:0]
		for _, r := range pending {
			if r.ctx.Err() == nil {
				batch = append(batch, r)
			}
		}
		pending = pending[:0]
		e.send(batch)
	}
}

func (e *Elections) flushAt(rs []*writeReq) time.Time {
	var at time.Time
	for i, r := range rs {
		if i == 0 || r.flush.Before(at) {
			at = r.flush
		}
	}
	return at
}

// send writes one batch and hands out the results.
func (e *Elections) send(batch []*writeReq) {
	switch len(batch) {
	case 0:
		return
	case 1:
		r := batch[0]
		rec, err := e.store.Heartbeat(r.ctx, r.w.Expected, r.w.Next)
		r.reply <- WriteResult{Record: rec, Err: err}
		return
	}
	// The batch lasts as long as its most patient write allows.
	var deadline time.Time
	bounded := true
	writes := make([]Write, len(batch))
	for i, r := range batch {
		writes[i] = r.w
		d, ok := r.ctx.Deadline()
		if !ok {
			bounded = false
		} else if d.After(deadline) {
			deadline = d
		}
	}
	ctx, cancel := context.WithCancel(e.ctx)
	if bounded {
		ctx, cancel = context.WithDeadline(e.ctx, deadline)
	}
	results, err := e.batch.HeartbeatBatch(ctx, writes)
	cancel()
	if err == nil && len(results) != len(batch) {
		err = fmt.Errorf("leaderfeed: store returned %d results for a batch of %d writes", len(results), len(batch))
	}
	for i, r := range batch {
		if err != nil {
			r.reply <- WriteResult{Err: err}
		} else {
			r.reply <- results[i]
		}
	}
}

func (e *Elections) failWrites(pending []*writeReq) {
	err := fmt.Errorf("leaderfeed: elections: %w", ErrClosed)
	for _, r := range pending {
		r.reply <- WriteResult{Err: err}
	}
	for {
		select {
		case r := <-e.writes:
			r.reply <- WriteResult{Err: err}
		default:
			return
		}
	}
}
