// Package memory is an in-process leaderfeed backend: the reference
// implementation of base.Backend and the embedded default of the examples
// and unit tests.
//
// A Store holds any number of election records and other records, and feeds
// every change to every subscriber in commit order. Many feeds in one
// process can share a Store safely. It is NOT for use across processes: a
// Store lives in one process's memory, so nodes in other processes cannot
// see it, and it is gone when the process exits. Use the postgres, mongo or
// rethink backend for real deployments.
package memory

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// Table is the name memory reports as Change.Table.
const Table = "memory"

// Store is an in-memory table of election records and other records, with
// a changefeed. The zero value is not usable; call NewStore.
type Store struct {
	mu      sync.Mutex
	records map[string]heartbeat.Record
	others  map[string]json.RawMessage
	subs    map[*subscription]struct{}
	lastTS  time.Time
}

// NewStore returns an empty Store.
func NewStore() *Store {
	return &Store{
		records: make(map[string]heartbeat.Record),
		others:  make(map[string]json.RawMessage),
		subs:    make(map[*subscription]struct{}),
	}
}

// Backend returns a backend for the election named election on s. Each Feed
// needs a Backend of its own; all of them share the Store.
func (s *Store) Backend(election string) (*Backend, error) {
	if err := heartbeat.ValidateName("election name", election); err != nil {
		return nil, fmt.Errorf("memory: %w: %w", base.ErrInvalidConfig, err)
	}
	return &Backend{store: s, election: election, subs: make(map[*subscription]struct{})}, nil
}

// now returns the store's clock, which never goes backwards.
func (s *Store) now() time.Time {
	t := time.Now().Round(0)
	if !t.After(s.lastTS) {
		t = s.lastTS.Add(time.Nanosecond)
	}
	s.lastTS = t
	return t
}

// Put inserts or replaces the other record with key, whose content doc is
// marshalled to JSON, and notifies every subscriber with a change.
func (s *Store) Put(key string, doc any) error {
	data, err := json.Marshal(doc)
	if err != nil {
		return fmt.Errorf("memory: record %q: %w", key, err)
	}
	keyJSON, _ := json.Marshal(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	old, ok := s.others[key]
	s.others[key] = data
	c := base.Change{Table: Table, Op: base.Insert, Key: keyJSON, New: data}
	if ok {
		c.Op, c.Old = base.Update, old
	}
	s.publish(base.Notification{Type: base.OtherChanged, Change: c}, "")
	return nil
}

// Delete deletes the other record with key and notifies every subscriber.
// Deleting a missing record does nothing.
func (s *Store) Delete(key string) {
	keyJSON, _ := json.Marshal(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	old, ok := s.others[key]
	if !ok {
		return
	}
	delete(s.others, key)
	s.publish(base.Notification{Type: base.OtherChanged, Change: base.Change{Table: Table, Op: base.Delete, Key: keyJSON, Old: old}}, "")
}

// Keys returns the keys of the other records, sorted.
func (s *Store) Keys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]string, 0, len(s.others))
	for k := range s.others {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// publishRecord sends r to the subscribers of its election, as a record or,
// when it is malformed, as an Ignored notification. s.mu is held.
func (s *Store) publishRecord(r heartbeat.Record) {
	n := base.Notification{Type: base.RecordChanged, Record: r}
	if err := r.Validate(); err != nil {
		n = base.Notification{Type: base.Ignored, Err: fmt.Errorf("memory: %w: %w", base.ErrMalformedRecord, err)}
	}
	s.publish(n, r.Election)
}

// publish queues n for every subscriber, or only for the subscribers of
// election when election is not empty. s.mu is held, which keeps the order
// of commits and notifications the same.
func (s *Store) publish(n base.Notification, election string) {
	for sub := range s.subs {
		if election == "" || sub.election == election {
			sub.push(n)
		}
	}
}

// Backend is the backend of one election on a Store. Its methods are safe
// for concurrent use.
type Backend struct {
	store    *Store
	election string

	mu     sync.Mutex
	closed bool
	subs   map[*subscription]struct{}
}

var _ base.Backend = (*Backend)(nil)

// Election returns the election's name.
func (b *Backend) Election() string { return b.election }

func (b *Backend) check(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return fmt.Errorf("memory: election %q: %w", b.election, base.ErrClosed)
	}
	return nil
}

// Start checks ctx and that b is open; a Store needs no connection.
func (b *Backend) Start(ctx context.Context) error { return b.check(ctx) }

// Create does nothing but checks: a Store needs no tables.
func (b *Backend) Create(ctx context.Context) error { return b.check(ctx) }

// Get returns the election record.
func (b *Backend) Get(ctx context.Context) (heartbeat.Record, error) {
	if err := b.check(ctx); err != nil {
		return heartbeat.Record{}, err
	}
	b.store.mu.Lock()
	r, ok := b.store.records[b.election]
	b.store.mu.Unlock()
	if !ok {
		return heartbeat.Record{}, fmt.Errorf("memory: election %q: %w", b.election, base.ErrNotFound)
	}
	if err := r.Validate(); err != nil {
		return heartbeat.Record{}, fmt.Errorf("memory: %w: %w", base.ErrMalformedRecord, err)
	}
	return r.Clone(), nil
}

// Heartbeat is the compare-and-set write, atomic under the Store's lock.
func (b *Backend) Heartbeat(ctx context.Context, expected, next heartbeat.Record) (heartbeat.Record, error) {
	if err := b.check(ctx); err != nil {
		return heartbeat.Record{}, err
	}
	next.Election = b.election
	if err := next.Validate(); err != nil {
		return heartbeat.Record{}, fmt.Errorf("memory: %w: %w", base.ErrInvalidConfig, err)
	}
	s := b.store
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, ok := s.records[b.election]
	if !ok {
		cur = heartbeat.Record{Election: b.election}
	}
	if ok {
		if err := cur.Validate(); err != nil {
			return heartbeat.Record{}, fmt.Errorf("memory: %w: %w", base.ErrMalformedRecord, err)
		}
	}
	if (expected.Revision == 0 && ok) || (expected.Revision != 0 && !cur.SameWrite(expected)) {
		return heartbeat.Record{}, base.NewConflict(cur.Clone())
	}
	rec := heartbeat.Record{
		Election:  b.election,
		Leader:    next.Leader,
		Term:      next.Term,
		Revision:  expected.Revision + 1,
		Timestamp: s.now(),
		Value:     next.Value,
		Lease:     next.Lease,
	}.Clone()
	s.records[b.election] = rec
	s.publishRecord(rec)
	return rec.Clone(), nil
}

// Subscribe returns the changefeed: this election's record changes and all
// other records' changes, in commit order. Nothing is dropped: each
// subscription queues what its reader has not taken yet.
func (b *Backend) Subscribe(ctx context.Context) (<-chan base.Notification, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	sub := &subscription{election: b.election, wake: make(chan struct{}, 1), out: make(chan base.Notification)}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, fmt.Errorf("memory: election %q: %w", b.election, base.ErrClosed)
	}
	b.subs[sub] = struct{}{}
	b.mu.Unlock()
	b.store.mu.Lock()
	b.store.subs[sub] = struct{}{}
	b.store.mu.Unlock()
	go func() {
		sub.run(ctx)
		b.store.mu.Lock()
		delete(b.store.subs, sub)
		b.store.mu.Unlock()
		b.mu.Lock()
		delete(b.subs, sub)
		b.mu.Unlock()
	}()
	return sub.out, nil
}

// Close ends the subscriptions of b; later calls fail with base.ErrClosed.
// It is idempotent.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	subs := make([]*subscription, 0, len(b.subs))
	for s := range b.subs {
		subs = append(subs, s)
	}
	b.mu.Unlock()
	for _, s := range subs {
		s.close(fmt.Errorf("memory: election %q: %w", b.election, base.ErrClosed))
	}
	return nil
}

// subscription queues notifications without bound and hands them to its
// reader in order on out.
type subscription struct {
	election string
	wake     chan struct{}
	out      chan base.Notification

	mu     sync.Mutex
	queue  []base.Notification
	err    error // set by close: send Failed and end
	closed bool
}

func (s *subscription) push(n base.Notification) {
	s.mu.Lock()
	if !s.closed {
		s.queue = append(s.queue, n)
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *subscription) close(err error) {
	s.mu.Lock()
	if !s.closed {
		s.closed, s.err = true, err
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *subscription) run(ctx context.Context) {
	defer close(s.out)
	for {
		s.mu.Lock()
		q, err := s.queue, s.err
		s.queue = nil
		s.mu.Unlock()
		if err != nil {
			q = append(q[:0:0], base.Notification{Type: base.Failed, Err: err})
		}
		for _, n := range q {
			select {
			case s.out <- n:
			case <-ctx.Done():
				return
			}
		}
		if err != nil {
			return
		}
		select {
		case <-s.wake:
		case <-ctx.Done():
			return
		}
	}
}
