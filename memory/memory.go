// Package memory is an in-process leaderfeed backend: the reference
// implementation of backend.Store (and backend.BatchStore,
// backend.BatchReader, backend.PresenceStore, backend.PresenceBatchStore,
// backend.GuardStore)
// and the embedded default of the examples and unit tests.
//
// A DB holds any number of election records and other records, and feeds
// every change to every subscriber in commit order; each of its Conns is a
// backend.Store over it. Many feeds in one process can share a DB safely.
// It is NOT for use across processes: a DB lives in one process's memory,
// so nodes in other processes cannot see it, and it is gone when the
// process exits. Use the postgres, mongo or rethink backend for real
// deployments.
package memory

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/internal/mailbox"
)

// Table is the name memory reports as Change.Table.
const Table = "memory"

// DB is an in-process database: a table of election records and other
// records, with a changefeed. The zero value is not usable; call NewDB.
type DB struct {
	mu      sync.Mutex
	records map[string]heartbeat.Record
	others  map[string]json.RawMessage
	present map[string]map[string]backend.Presence // election -> node -> presence
	subs    map[*subscription]struct{}
	lastTS  time.Time
	writes  uint64
}

// NewDB returns an empty DB.
func NewDB() *DB {
	return &DB{
		records: make(map[string]heartbeat.Record),
		others:  make(map[string]json.RawMessage),
		present: make(map[string]map[string]backend.Presence),
		subs:    make(map[*subscription]struct{}),
	}
}

// Conn returns a new connection to db: a backend.Store (and backend.BatchStore,
// backend.BatchReader) of its own, as a database client would be. Each
// base.Elections needs a Conn of its own; all of them share the records
// of db.
func (db *DB) Conn() *Conn {
	return &Conn{db: db, subs: make(map[*subscription]struct{})}
}

// Election returns the backend.Election of one election on db, on a Conn of its own
// (base.Open): for one Feed. Nodes of one election in one process each take
// a Backend; all of them share the records of db.
func (db *DB) Election(election string) (backend.Election, error) {
	b, err := base.Open(db.Conn(), election)
	if err != nil {
		return nil, fmt.Errorf("memory: %w", err)
	}
	return b, nil
}

// now returns the database's clock, which never goes backwards.
func (db *DB) now() time.Time {
	t := time.Now().Round(0)
	if !t.After(db.lastTS) {
		t = db.lastTS.Add(time.Nanosecond)
	}
	db.lastTS = t
	return t
}

// Put inserts or replaces the other record with key, whose content doc is
// marshalled to JSON, and notifies every subscriber with a change.
func (db *DB) Put(key string, doc any) error {
	data, err := json.Marshal(doc)
	if err != nil {
		return fmt.Errorf("memory: record %q: %w", key, err)
	}
	keyJSON, _ := json.Marshal(key)
	db.mu.Lock()
	defer db.mu.Unlock()
	old, ok := db.others[key]
	db.others[key] = data
	c := backend.Change{Table: Table, Op: backend.Insert, Key: keyJSON, New: data}
	if ok {
		c.Op, c.Old = backend.Update, old
	}
	db.publish(backend.Notification{Type: backend.OtherChanged, Change: c})
	return nil
}

// Delete deletes the other record with key and notifies every subscriber.
// Deleting a missing record does nothing.
func (db *DB) Delete(key string) {
	keyJSON, _ := json.Marshal(key)
	db.mu.Lock()
	defer db.mu.Unlock()
	old, ok := db.others[key]
	if !ok {
		return
	}
	delete(db.others, key)
	db.publish(backend.Notification{Type: backend.OtherChanged, Change: backend.Change{Table: Table, Op: backend.Delete, Key: keyJSON, Old: old}})
}

// Keys returns the keys of the other records, sorted.
func (db *DB) Keys() []string {
	db.mu.Lock()
	defer db.mu.Unlock()
	keys := make([]string, 0, len(db.others))
	for k := range db.others {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// publishRecord sends r to every subscriber, as a record or, when it is
// malformed, as an Ignored notification. db.mu is held.
func (db *DB) publishRecord(r heartbeat.Record) {
	n := backend.Notification{Type: backend.RecordChanged, Record: r}
	if err := r.Validate(); err != nil {
		n = backend.Notification{Type: backend.Ignored, Election: r.Election, Err: fmt.Errorf("memory: %w: %w", backend.ErrMalformedRecord, err)}
	}
	db.publish(n)
}

// publish queues n for every subscriber. db.mu is held, which keeps the
// order of commits and notifications the same.
func (db *DB) publish(n backend.Notification) {
	for sub := range db.subs {
		sub.Put(n)
	}
}

// Conn is a connection to a DB: the backend.Store, backend.BatchStore and
// backend.BatchReader of package memory. Its methods are safe for concurrent use.
type Conn struct {
	db *DB

	mu     sync.Mutex
	closed bool
	subs   map[*subscription]struct{}
}

var (
	_ backend.BatchStore         = (*Conn)(nil)
	_ backend.BatchReader        = (*Conn)(nil)
	_ backend.PresenceStore      = (*Conn)(nil)
	_ backend.PresenceBatchStore = (*Conn)(nil)
)

func (c *Conn) check(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("memory: %w", base.ErrClosed)
	}
	return nil
}

// Start checks ctx and that c is open; a DB needs no connection.
func (c *Conn) Start(ctx context.Context) error { return c.check(ctx) }

// Create does nothing but checks: a DB needs no tables.
func (c *Conn) Create(ctx context.Context) error { return c.check(ctx) }

// Get returns the record of election.
func (c *Conn) Get(ctx context.Context, election string) (heartbeat.Record, error) {
	if err := c.check(ctx); err != nil {
		return heartbeat.Record{}, err
	}
	c.db.mu.Lock()
	r, ok := c.db.records[election]
	c.db.mu.Unlock()
	return readResult(election, r, ok)
}

func readResult(election string, r heartbeat.Record, ok bool) (heartbeat.Record, error) {
	if !ok {
		return heartbeat.Record{}, fmt.Errorf("memory: election %q: %w", election, backend.ErrNotFound)
	}
	if err := r.Validate(); err != nil {
		return heartbeat.Record{}, fmt.Errorf("memory: %w: %w", backend.ErrMalformedRecord, err)
	}
	return r.Clone(), nil
}

// GetBatch returns the records of elections, read in one step under the
// DB's lock, each as Get would.
func (c *Conn) GetBatch(ctx context.Context, elections []string) ([]backend.ReadResult, error) {
	if err := c.check(ctx); err != nil {
		return nil, err
	}
	out := make([]backend.ReadResult, len(elections))
	c.db.mu.Lock()
	defer c.db.mu.Unlock()
	for i, e := range elections {
		r, ok := c.db.records[e]
		out[i].Record, out[i].Err = readResult(e, r, ok)
	}
	return out, nil
}

// Heartbeat is the compare-and-set write, atomic under the DB's lock.
func (c *Conn) Heartbeat(ctx context.Context, expected, next heartbeat.Record) (heartbeat.Record, error) {
	if err := c.check(ctx); err != nil {
		return heartbeat.Record{}, err
	}
	if err := next.Validate(); err != nil {
		return heartbeat.Record{}, fmt.Errorf("memory: %w: %w", base.ErrInvalidConfig, err)
	}
	db := c.db
	db.mu.Lock()
	defer db.mu.Unlock()
	return db.write(expected, next)
}

// HeartbeatGuarded is Heartbeat that also requires the presence record of
// guard (backend.GuardStore), atomic under the DB's lock with the write
// and with Absent.
func (c *Conn) HeartbeatGuarded(ctx context.Context, expected, next heartbeat.Record, guard backend.Guard) (heartbeat.Record, error) {
	if err := c.check(ctx); err != nil {
		return heartbeat.Record{}, err
	}
	if err := next.Validate(); err != nil {
		return heartbeat.Record{}, fmt.Errorf("memory: %w: %w", base.ErrInvalidConfig, err)
	}
	if err := heartbeat.ValidateName("guard node id", guard.Node); err != nil {
		return heartbeat.Record{}, fmt.Errorf("memory: %w: %w", base.ErrInvalidConfig, err)
	}
	if guard.Incarnation > heartbeat.MaxToken {
		return heartbeat.Record{}, fmt.Errorf("memory: %w: guard incarnation %d exceeds heartbeat.MaxToken", base.ErrInvalidConfig, guard.Incarnation)
	}
	if expected.Revision == 0 {
		return heartbeat.Record{}, fmt.Errorf("memory: a guarded write needs an existing record (expected revision 0): %w", base.ErrInvalidConfig)
	}
	db := c.db
	db.mu.Lock()
	defer db.mu.Unlock()
	if cur, ok := db.records[next.Election]; ok && cur.Validate() == nil && cur.SameWrite(expected) {
		if p, ok := db.present[next.Election][guard.Node]; !ok || p.Incarnation != guard.Incarnation {
			return heartbeat.Record{}, fmt.Errorf("memory: election %q: node %q (incarnation %d): %w", next.Election, guard.Node, guard.Incarnation, backend.ErrNotPresent)
		}
	}
	return db.write(expected, next)
}

// HeartbeatBatch performs writes as one atomic step under the DB's lock,
// each with the semantics of Heartbeat. Writes that break
// heartbeat.Record.Validate fail alone.
func (c *Conn) HeartbeatBatch(ctx context.Context, writes []backend.Write) ([]backend.WriteResult, error) {
	if err := c.check(ctx); err != nil {
		return nil, err
	}
	out := make([]backend.WriteResult, len(writes))
	db := c.db
	db.mu.Lock()
	defer db.mu.Unlock()
	for i, w := range writes {
		if err := w.Next.Validate(); err != nil {
			out[i].Err = fmt.Errorf("memory: %w: %w", base.ErrInvalidConfig, err)
			continue
		}
		out[i].Record, out[i].Err = db.write(w.Expected, w.Next)
	}
	return out, nil
}

// write is one compare-and-set; db.mu is held and next is valid.
func (db *DB) write(expected, next heartbeat.Record) (heartbeat.Record, error) {
	cur, ok := db.records[next.Election]
	if !ok {
		cur = heartbeat.Record{Election: next.Election}
	}
	if ok {
		if err := cur.Validate(); err != nil {
			return heartbeat.Record{}, fmt.Errorf("memory: %w: %w", backend.ErrMalformedRecord, err)
		}
	}
	if (expected.Revision == 0 && ok) || (expected.Revision != 0 && !cur.SameWrite(expected)) {
		return heartbeat.Record{}, backend.NewConflict(cur.Clone())
	}
	rec := heartbeat.Record{
		Election:    next.Election,
		Leader:      next.Leader,
		Term:        next.Term,
		Revision:    expected.Revision + 1,
		Timestamp:   db.now(),
		Value:       next.Value,
		Lease:       next.Lease,
		Successor:   next.Successor,
		Handover:    next.Handover,
		Incarnation: next.Incarnation,
	}.Clone()
	db.records[next.Election] = rec
	db.writes++
	db.publishRecord(rec)
	return rec.Clone(), nil
}

// Subscribe returns the changefeed of the DB: every election's record
// changes and all other records' changes, in commit order. Nothing is
// dropped: each subscription queues what its reader has not taken yet.
func (c *Conn) Subscribe(ctx context.Context) (<-chan backend.Notification, error) {
	if err := c.check(ctx); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, fmt.Errorf("memory: %w", base.ErrClosed)
	}
	// Both locks are held until sub is in both sets: its end (when ctx
	// ends, on a goroutine of its own) takes them to remove it.
	c.db.mu.Lock()
	defer c.db.mu.Unlock()
	// The channel holds a burst of commits (a batch of writes), so that
	// they reach a reader that keeps up without the pipe's goroutine.
	var sub *subscription
	sub = mailbox.NewPipe[backend.Notification](ctx, 64, func() {
		c.db.mu.Lock()
		delete(c.db.subs, sub)
		c.db.mu.Unlock()
		c.mu.Lock()
		delete(c.subs, sub)
		c.mu.Unlock()
	})
	c.subs[sub] = struct{}{}
	c.db.subs[sub] = struct{}{}
	return sub.C(), nil
}

// Close ends the subscriptions of c; later calls fail with base.ErrClosed.
// It is idempotent.
func (c *Conn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	subs := make([]*subscription, 0, len(c.subs))
	for s := range c.subs {
		subs = append(subs, s)
	}
	c.mu.Unlock()
	for _, s := range subs {
		s.End(backend.Notification{Type: backend.Failed, Err: fmt.Errorf("memory: %w", base.ErrClosed)}, false)
	}
	return nil
}

// Present writes the presence record of p.Node in election, stamped with
// the DB's clock. Presence records are not announced on the changefeed.
func (c *Conn) Present(ctx context.Context, election string, p backend.Presence) error {
	if err := c.check(ctx); err != nil {
		return err
	}
	if err := p.Validate(); err != nil {
		return fmt.Errorf("memory: %w: %w", base.ErrInvalidConfig, err)
	}
	db := c.db
	db.mu.Lock()
	defer db.mu.Unlock()
	db.present1(election, p)
	return nil
}

// PresentBatch writes the presence records of writes in one step under
// the DB's lock, each as Present would. A write that breaks the rules of
// backend.PresenceBatch fails alone.
func (c *Conn) PresentBatch(ctx context.Context, writes []backend.PresenceWrite) ([]error, error) {
	if err := c.check(ctx); err != nil {
		return nil, err
	}
	out := make([]error, len(writes))
	seen := make(backend.PresenceBatch, len(writes))
	db := c.db
	db.mu.Lock()
	defer db.mu.Unlock()
	for i, w := range writes {
		if err := seen.Add(w, i); err != nil {
			out[i] = fmt.Errorf("memory: %w: %w", base.ErrInvalidConfig, err)
			continue
		}
		db.present1(w.Election, w.Presence)
	}
	return out, nil
}

// present1 writes one valid presence record; db.mu is held.
func (db *DB) present1(election string, p backend.Presence) {
	m := db.present[election]
	if m == nil {
		m = make(map[string]backend.Presence)
		db.present[election] = m
	}
	p.Value = bytes.Clone(p.Value)
	p.Timestamp = db.now()
	p.Joined = p.Timestamp
	if old, ok := m[p.Node]; ok && old.Incarnation == p.Incarnation {
		p.Joined = old.Joined // the same process life: it joined then
	}
	m[p.Node] = p
}

// Absent deletes the presence record of node in election.
func (c *Conn) Absent(ctx context.Context, election, node string) error {
	if err := c.check(ctx); err != nil {
		return err
	}
	db := c.db
	db.mu.Lock()
	defer db.mu.Unlock()
	delete(db.present[election], node)
	if len(db.present[election]) == 0 {
		delete(db.present, election)
	}
	return nil
}

// Participants returns every presence record of election and the DB's
// clock.
func (c *Conn) Participants(ctx context.Context, election string) ([]backend.Presence, time.Time, error) {
	if err := c.check(ctx); err != nil {
		return nil, time.Time{}, err
	}
	db := c.db
	db.mu.Lock()
	defer db.mu.Unlock()
	return db.participants(election), db.now(), nil
}

// ParticipantsBatch returns the presence records of elections, read in
// one step under the DB's lock, each as Participants would.
func (c *Conn) ParticipantsBatch(ctx context.Context, elections []string) ([]backend.ParticipantsResult, error) {
	if err := c.check(ctx); err != nil {
		return nil, err
	}
	out := make([]backend.ParticipantsResult, len(elections))
	seen := make(heartbeat.Batch, len(elections))
	db := c.db
	db.mu.Lock()
	defer db.mu.Unlock()
	now := db.now()
	for i, e := range elections {
		if err := seen.Add(e, i); err != nil {
			out[i].Err = fmt.Errorf("memory: %w: %w", base.ErrInvalidConfig, err)
			continue
		}
		out[i] = backend.ParticipantsResult{Presences: db.participants(e), Now: now}
	}
	return out, nil
}

// participants returns copies of the presence records of election; db.mu
// is held.
func (db *DB) participants(election string) []backend.Presence {
	out := make([]backend.Presence, 0, len(db.present[election]))
	for _, p := range db.present[election] {
		p.Value = bytes.Clone(p.Value)
		out = append(out, p)
	}
	return out
}

// Writes returns how many records the DB has written (every successful
// compare-and-set, batched or not), for benchmarks.
func (db *DB) Writes() uint64 {
	db.mu.Lock()
	defer db.mu.Unlock()
	return db.writes
}

// subscription hands notifications to its reader in order, queueing
// without bound what the reader has not taken yet.
type subscription = mailbox.Pipe[backend.Notification]
