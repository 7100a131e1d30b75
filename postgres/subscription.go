package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// Limits of a subscription's queue, which holds what the listener has
// received and the reader has not taken yet.
const (
	// coalesceAt: from this many queued items on, a new item about the
	// election record replaces the queued ones (the reader gets the latest
	// state, as base.Backend allows).
	coalesceAt = 64
	// maxQueue: a subscription whose reader falls this far behind fails.
	maxQueue = 4096
)

// item is one queued notification. fetch: the record did not fit in the
// notification; read it. record: the item is about the election record.
type item struct {
	n      base.Notification
	fetch  bool
	record bool
}

func recordOnly(election string) heartbeat.Record { return heartbeat.Record{Election: election} }

// subscription is one Subscribe: the listener queues items on it without
// blocking, and its own goroutine (run) hands them to the reader.
type subscription struct {
	b         *Backend
	ctx       context.Context
	cancel    context.CancelFunc
	out       chan base.Notification
	ready     chan error // the listener's answer to add
	channel   string
	recordKey tableKey
	watchKey  tableKey // zero when the backend watches no table
	removed   bool     // guarded by the listener's mu

	mu      sync.Mutex // guards queue and failErr
	queue   []item
	failErr error
	signal  chan struct{}
}

func newSubscription(ctx context.Context, b *Backend) *subscription {
	ctx, cancel := context.WithCancel(ctx)
	o := b.opts
	s := &subscription{
		b:         b,
		ctx:       ctx,
		cancel:    cancel,
		out:       make(chan base.Notification),
		ready:     make(chan error, 1),
		channel:   o.ChannelPrefix,
		recordKey: tableKey{o.ChannelPrefix, o.Schema, o.Table},
		signal:    make(chan struct{}, 1),
	}
	if o.WatchTable != "" {
		s.watchKey = tableKey{o.ChannelPrefix, o.WatchSchema, o.WatchTable}
	}
	return s
}

func (s *subscription) keys() []tableKey {
	if s.watchKey == (tableKey{}) {
		return []tableKey{s.recordKey}
	}
	return []tableKey{s.recordKey, s.watchKey}
}

func (s *subscription) lock()   { s.mu.Lock() }
func (s *subscription) unlock() { s.mu.Unlock() }

func (s *subscription) poke() {
	select {
	case s.signal <- struct{}{}:
	default:
	}
}

// enqueue queues it; called by the listener, never blocks for long.
func (s *subscription) enqueue(it item) {
	s.lock()
	defer s.unlock()
	if s.failErr != nil {
		return
	}
	if it.record && len(s.queue) >= coalesceAt {
		kept := s.queue[:0]
		for _, q := range s.queue {
			if !q.record {
				kept = append(kept, q)
			}
		}
		clear(s.queue[len(kept):])
		s.queue = kept
	}
	if len(s.queue) >= maxQueue {
		s.failErr = fmt.Errorf("postgres: subscription of election %q fell %d notifications behind", s.b.election, maxQueue)
	} else {
		s.queue = append(s.queue, it)
	}
	s.poke()
}

// fail makes err the subscription's last notification, after what is
// queued.
func (s *subscription) fail(err error) {
	s.lock()
	defer s.unlock()
	if s.failErr == nil {
		s.failErr = err
	}
	s.poke()
}

// dropStale removes queued record items older than rev, after a fetch
// returned revision rev.
func (s *subscription) dropStale(rev uint64) {
	s.lock()
	defer s.unlock()
	kept := s.queue[:0]
	for _, q := range s.queue {
		if q.record && q.n.Type == base.RecordChanged && q.n.Record.Revision <= rev {
			continue
		}
		kept = append(kept, q)
	}
	clear(s.queue[len(kept):])
	s.queue = kept
}

// run hands the queued items to the reader, then the failure if any, and
// closes the channel.
func (s *subscription) run() {
	defer func() {
		s.b.listener.remove(s)
		s.b.forget(s)
		s.cancel()
		close(s.out)
		s.b.wg.Done()
	}()
	for {
		s.lock()
		if len(s.queue) > 0 {
			it := s.queue[0]
			s.queue[0] = item{}
			s.queue = s.queue[1:]
			s.unlock()
			n, ok := s.resolve(it)
			if !ok {
				s.closing()
				return
			}
			select {
			case s.out <- n:
			case <-s.ctx.Done():
				s.closing()
				return
			}
			if n.Type == base.Failed {
				return
			}
			continue
		}
		ferr := s.failErr
		s.unlock()
		if ferr != nil {
			select {
			case s.out <- base.Notification{Type: base.Failed, Err: ferr}:
			case <-s.ctx.Done():
				s.closing()
			}
			return
		}
		select {
		case <-s.signal:
		case <-s.ctx.Done():
			s.closing()
			return
		}
	}
}

// closing runs when the subscription's context is done: if that is
// because the backend closed, it tells a reader that is waiting right now.
func (s *subscription) closing() {
	if s.b.closed.Load() {
		select {
		case s.out <- base.Notification{Type: base.Failed, Err: fmt.Errorf("postgres: backend closed: %w", base.ErrClosed)}:
		default:
		}
	}
}

// resolve turns an item into its notification, reading the record when it
// did not fit in the notification. ok is false when ctx ended.
func (s *subscription) resolve(it item) (base.Notification, bool) {
	if !it.fetch {
		return it.n, true
	}
	r, err := s.b.get(s.ctx)
	switch {
	case err == nil:
		s.dropStale(r.Revision)
		return base.Notification{Type: base.RecordChanged, Record: r}, true
	case errors.Is(err, base.ErrNotFound):
		return base.Notification{Type: base.RecordDeleted, Record: recordOnly(s.b.election)}, true
	case errors.Is(err, base.ErrMalformedRecord):
		return base.Notification{Type: base.Ignored, Err: err}, true
	case s.ctx.Err() != nil:
		return base.Notification{}, false
	}
	return base.Notification{Type: base.Failed, Err: fmt.Errorf("postgres: reading a record too large for its notification: %w", err)}, true
}
