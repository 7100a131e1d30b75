// Package logstore is the backend that docs/EXTENDING.md builds step by
// step: a leaderfeed backend on a small in-process store, Log, that keeps
// its documents in a table and writes every change to an append-only log.
// The changefeed is a reader of that log with a cursor, the way a backend
// tails a database's own change log (an oplog, a write-ahead log, a table
// with a serial id).
//
// Like package memory, a Log lives in one process: it teaches how to write
// a backend and passes the conformance suite, but it is not a way to elect
// a leader among several processes.
package logstore

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// Table is the name a Log reports as backend.Change.Table.
const Table = "log"

// Keep is how many log entries a Log keeps at least. A subscriber that falls
// further behind has missed changes: its feed fails, and base.Feed re-reads
// the record and subscribes again.
const Keep = 1024

// Log is a table of JSON documents, keyed by string, that appends every
// write to a log. Election records and other documents share the table.
// Its methods are safe for concurrent use.
type Log struct {
	mu     sync.Mutex
	docs   map[string]json.RawMessage // the current document of each key
	log    []entry                    // the latest writes, oldest first
	first  uint64                     // the sequence number of log[0]
	grew   chan struct{}              // closed and replaced on every append
	lastTS time.Time
}

// entry is one write in the log.
type entry struct {
	key      string
	op       backend.Op
	old, new json.RawMessage // nil when there is none
}

// NewLog returns an empty Log.
func NewLog() *Log {
	return &Log{docs: make(map[string]json.RawMessage), grew: make(chan struct{})}
}

// write stores doc under key (nil deletes it) and appends the change to the
// log. l.mu is held: the table and the log change in one step, so the log's
// order is the commit order.
func (l *Log) write(key string, doc json.RawMessage) {
	old, existed := l.docs[key]
	e := entry{key: key, op: backend.Update, old: old, new: doc}
	switch {
	case doc == nil:
		delete(l.docs, key)
		e.op = backend.Delete
	case !existed:
		l.docs[key] = doc
		e.op = backend.Insert
	default:
		l.docs[key] = doc
	}
	l.log = append(l.log, e)
	if len(l.log) > 2*Keep { // drop the oldest entries, keep Keep
		drop := len(l.log) - Keep
		l.log = slices.Clone(l.log[drop:])
		l.first += uint64(drop)
	}
	close(l.grew) // wake every reader
	l.grew = make(chan struct{})
}

// since returns the entries from sequence number seq on, the sequence number
// after them, and a channel that is closed when the log grows. ok is false
// when entries from seq on were dropped already.
func (l *Log) since(seq uint64) (entries []entry, next uint64, grew <-chan struct{}, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	end := l.first + uint64(len(l.log))
	if seq < l.first {
		return nil, end, l.grew, false
	}
	return slices.Clone(l.log[seq-l.first:]), end, l.grew, true
}

// end returns the sequence number of the next write.
func (l *Log) end() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.first + uint64(len(l.log))
}

// now returns the store's clock, which never goes backwards. l.mu is held.
func (l *Log) now() time.Time {
	t := time.Now().UTC().Round(0) // Round(0) drops the monotonic reading
	if !t.After(l.lastTS) {
		t = l.lastTS.Add(time.Nanosecond)
	}
	l.lastTS = t
	return t
}

// Put stores doc, marshalled to JSON, under key: the application's own
// writes. Subscribers see it as a backend.Change. Putting a document under an
// election's key overwrites the election record, as a foreign client would.
func (l *Log) Put(key string, doc any) error {
	data, err := json.Marshal(doc)
	if err != nil {
		return fmt.Errorf("logstore: document %q: %w", key, err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.write(key, data)
	return nil
}

// Delete deletes the document under key. Deleting a missing one does
// nothing.
func (l *Log) Delete(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.docs[key]; ok {
		l.write(key, nil)
	}
}

// stored is the JSON form of an election record in the table.
type stored struct {
	Mark     int       `json:"leaderfeed"` // 1: an election record
	Leader   string    `json:"leader"`
	Term     int64     `json:"term"`
	Revision int64     `json:"revision"`
	Time     time.Time `json:"ts"`
	Value    []byte    `json:"value,omitempty"`
	LeaseUS  int64     `json:"lease_us,omitempty"` // the writer's lease, µs
	// Successor: the node a vacancy is reserved for (a transfer); absent
	// in every other record, and in records of versions before it.
	Successor string `json:"successor,omitempty"`
	// Handover: the token of a led record written as a handover; absent
	// in every other record, and in records of versions before it.
	Handover int64 `json:"handover,omitempty"`
	// Incarnation: the incarnation of the process that wrote a led record
	// by a claim or renewal; absent in every other record, and in records
	// of versions before it.
	Incarnation int64 `json:"incarnation,omitempty"`
}

func encode(r heartbeat.Record) json.RawMessage {
	data, err := json.Marshal(stored{Mark: 1, Leader: r.Leader, Term: int64(r.Term), Revision: int64(r.Revision), Time: r.Timestamp, Value: r.Value,
		LeaseUS: heartbeat.LeaseMicros(r.Lease), Successor: r.Successor, Handover: int64(r.Handover),
		Incarnation: int64(r.Incarnation)})
	if err != nil {
		panic(err) // cannot happen: every field marshals
	}
	return data
}

// decode turns the document under an election's key into a record: the
// JSON here, the record rules (ranges, Validate, records of older
// versions) in heartbeat.Decode. A document that is not a valid election
// record is malformed.
func decode(election string, doc json.RawMessage) (heartbeat.Record, error) {
	var s stored
	d := json.NewDecoder(bytes.NewReader(doc))
	d.DisallowUnknownFields()
	err := d.Decode(&s)
	if err == nil && s.Mark != 1 {
		err = fmt.Errorf("not an election record: %s", doc)
	}
	var r heartbeat.Record
	if err == nil {
		r, err = heartbeat.Decode(heartbeat.Stored{Election: election, Leader: s.Leader, Term: s.Term, Revision: s.Revision,
			Timestamp: s.Time, Value: s.Value, LeaseMicros: &s.LeaseUS, Successor: &s.Successor, Handover: &s.Handover,
			Incarnation: &s.Incarnation})
	}
	if err != nil {
		return heartbeat.Record{}, fmt.Errorf("logstore: election %q: %w: %w", election, backend.ErrMalformedRecord, err)
	}
	return r, nil
}

// Marks of the documents of leaderfeed in the table.
const (
	markRecord   = 1 // an election record, under the election's name
	markPresence = 2 // a presence record, under backend.PresenceKey
)

// mark returns the leaderfeed mark of doc: 0 for the application's own
// documents.
func mark(doc json.RawMessage) int {
	var s struct {
		Mark int `json:"leaderfeed"`
	}
	if json.Unmarshal(doc, &s) != nil {
		return 0
	}
	return s.Mark
}

// isRecord reports whether doc is an election record (of any election).
func isRecord(doc json.RawMessage) bool { return mark(doc) == markRecord }

// Store is the backend.Store of a Log: a connection to it, as a database
// client would be. Each base.Elections needs a Store of its own; all of
// them may share the Log.
type Store struct {
	log    *Log
	closed chan struct{}
	once   sync.Once
}

var _ backend.Store = (*Store)(nil)

// Store returns a new connection to l.
func (l *Log) Store() *Store {
	return &Store{log: l, closed: make(chan struct{})}
}

// Election returns the backend.Election of one election on a Store of its own
// (base.Open): for one base.Feed. The name must pass heartbeat.ValidateName;
// errors match base.ErrInvalidConfig.
func (l *Log) Election(election string) (backend.Election, error) {
	b, err := base.Open(l.Store(), election)
	if err != nil {
		return nil, fmt.Errorf("logstore: %w", err)
	}
	return b, nil
}

// check is the start of every method: a done context and a closed store
// are errors.
func (s *Store) check(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case <-s.closed:
		return fmt.Errorf("logstore: %w", base.ErrClosed)
	default:
		return nil
	}
}

// Start has nothing to connect to; it checks ctx and that s is open.
func (s *Store) Start(ctx context.Context) error { return s.check(ctx) }

// Create has nothing to create; it checks ctx and that s is open.
func (s *Store) Create(ctx context.Context) error { return s.check(ctx) }

// Get returns the record of election.
func (s *Store) Get(ctx context.Context, election string) (heartbeat.Record, error) {
	if err := s.check(ctx); err != nil {
		return heartbeat.Record{}, err
	}
	s.log.mu.Lock()
	doc, ok := s.log.docs[election]
	s.log.mu.Unlock()
	if !ok {
		return heartbeat.Record{}, fmt.Errorf("logstore: election %q: %w", election, backend.ErrNotFound)
	}
	return decode(election, doc)
}

// Heartbeat is the compare-and-set write of the record next.Election. The
// Log's lock makes the read, the comparison and the write one atomic step.
func (s *Store) Heartbeat(ctx context.Context, expected, next heartbeat.Record) (heartbeat.Record, error) {
	if err := s.check(ctx); err != nil {
		return heartbeat.Record{}, err
	}
	if err := heartbeat.ValidateWrite(expected, next, math.MaxInt64); err != nil {
		return heartbeat.Record{}, fmt.Errorf("logstore: %w: %w", base.ErrInvalidConfig, err)
	}
	election := next.Election
	l := s.log
	l.mu.Lock()
	defer l.mu.Unlock()
	cur := heartbeat.Record{Election: election} // Revision 0: no record
	doc, ok := l.docs[election]
	if ok {
		var err error
		if cur, err = decode(election, doc); err != nil {
			return heartbeat.Record{}, err // never overwrite a malformed record
		}
	}
	// Compare the write's identity, not the revision alone (see
	// backend.Election.Heartbeat).
	if (expected.Revision == 0 && ok) || (expected.Revision != 0 && !cur.SameWrite(expected)) {
		return heartbeat.Record{}, backend.NewConflict(cur)
	}
	r := heartbeat.Record{
		Election:    election,
		Leader:      next.Leader,
		Term:        next.Term,
		Revision:    expected.Revision + 1,
		Timestamp:   l.now(),
		Value:       bytes.Clone(next.Value),
		Lease:       next.Lease,
		Successor:   next.Successor,
		Handover:    next.Handover,
		Incarnation: next.Incarnation,
	}
	l.write(election, encode(r))
	return r, nil
}

// Subscribe starts a reader of the log at its present end. It sends every
// change, in log order: the records of every election and the
// application's documents. It queues nothing: base.Elections does.
func (s *Store) Subscribe(ctx context.Context) (<-chan backend.Notification, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	out := make(chan backend.Notification)
	go s.follow(ctx, s.log.end(), out)
	return out, nil
}

// follow reads the log from cursor on until ctx is done or s is closed, and
// closes out when it ends.
func (s *Store) follow(ctx context.Context, cursor uint64, out chan<- backend.Notification) {
	defer close(out)
	send := func(n backend.Notification) bool {
		select {
		case out <- n:
			return true
		case <-ctx.Done():
			return false
		case <-s.closed:
			return false
		}
	}
	fail := func(err error) { // the last notification, unless ctx is done
		if ctx.Err() != nil {
			return
		}
		select {
		case out <- backend.Notification{Type: backend.Failed, Err: err}:
		case <-ctx.Done():
		}
	}
	closed := fmt.Errorf("logstore: %w", base.ErrClosed)
	for {
		entries, next, grew, ok := s.log.since(cursor)
		if !ok {
			fail(fmt.Errorf("logstore: the subscriber fell more than %d writes behind", Keep))
			return
		}
		for _, e := range entries {
			n, ok := notification(e)
			if !ok {
				continue
			}
			if !send(n) {
				fail(closed) // sends nothing if ctx is done
				return
			}
		}
		cursor = next
		select {
		case <-grew:
		case <-ctx.Done():
			return
		case <-s.closed:
			fail(closed)
			return
		}
	}
}

// notification turns a log entry into what the feed sends: a document with
// the election mark is an election record (of the election its key names),
// a presence record is not sent at all (false), any other document is the
// application's.
func notification(e entry) (backend.Notification, bool) {
	if mark(e.new) == markPresence || (e.new == nil && mark(e.old) == markPresence) {
		return backend.Notification{}, false // presence records are nobody's news
	}
	if isRecord(e.new) || (e.new == nil && isRecord(e.old)) {
		if e.op == backend.Delete {
			return backend.Notification{Type: backend.RecordDeleted, Election: e.key, Record: heartbeat.Record{Election: e.key}}, true
		}
		r, err := decode(e.key, e.new)
		if err != nil {
			return backend.Notification{Type: backend.Ignored, Election: e.key, Err: err}, true
		}
		return backend.Notification{Type: backend.RecordChanged, Record: r}, true
	}
	key, _ := json.Marshal(e.key)
	return backend.Notification{Type: backend.OtherChanged, Change: backend.Change{
		Table: Table, Op: e.op, Key: key, Old: e.old, New: e.new,
	}}, true
}

// Close ends s's subscriptions; afterwards every method fails with
// base.ErrClosed. It is idempotent. The Log stays usable.
func (s *Store) Close() error {
	s.once.Do(func() { close(s.closed) })
	return nil
}

// presenceDoc is the JSON form of a presence record in the table, under
// backend.PresenceKey(election, node): a key no election has.
type presenceDoc struct {
	Mark        int       `json:"leaderfeed"` // 2: a presence record
	Node        string    `json:"node"`
	Value       []byte    `json:"value,omitempty"`
	Priority    int       `json:"priority"`
	CanLead     bool      `json:"can_lead"`
	Token       uint64    `json:"token,omitempty"`
	Incarnation uint64    `json:"incarnation,omitempty"`
	Time        time.Time `json:"ts"`
	// Joined is when Incarnation first wrote the record: kept by the
	// writes of that incarnation, set anew by any other write.
	Joined time.Time `json:"joined"`
}

var _ backend.PresenceStore = (*Store)(nil)

// Present writes the presence record of p.Node in election, stamped with
// the Log's clock, and keeps its joined time when the record it replaces
// is of p.Incarnation (else the joined time is the new stamp): the read
// of the old record and the write are one step under the Log's lock. Its
// log entry is skipped by every feed: a refresh wakes no follower.
func (s *Store) Present(ctx context.Context, election string, p backend.Presence) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	if err := p.Validate(); err != nil {
		return fmt.Errorf("logstore: %w: %w", base.ErrInvalidConfig, err)
	}
	l := s.log
	l.mu.Lock()
	defer l.mu.Unlock()
	key := backend.PresenceKey(election, p.Node)
	d := presenceDoc{Mark: markPresence, Node: p.Node, Value: p.Value, Priority: p.Priority, CanLead: p.CanLead, Token: p.Token,
		Incarnation: p.Incarnation, Time: l.now()}
	d.Joined = d.Time
	var old presenceDoc
	if json.Unmarshal(l.docs[key], &old) == nil && old.Mark == markPresence && old.Incarnation == p.Incarnation {
		d.Joined = old.Joined // the same process life: it joined then
	}
	data, err := json.Marshal(d)
	if err != nil {
		return fmt.Errorf("logstore: presence of %q: %w", p.Node, err)
	}
	l.write(key, data)
	return nil
}

// Absent deletes the presence record of node in election.
func (s *Store) Absent(ctx context.Context, election, node string) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	l := s.log
	l.mu.Lock()
	defer l.mu.Unlock()
	if key := backend.PresenceKey(election, node); l.docs[key] != nil {
		l.write(key, nil)
	}
	return nil
}

// Participants returns the presence records of election and the Log's
// clock, read under one lock.
func (s *Store) Participants(ctx context.Context, election string) ([]backend.Presence, time.Time, error) {
	if err := s.check(ctx); err != nil {
		return nil, time.Time{}, err
	}
	l := s.log
	l.mu.Lock()
	defer l.mu.Unlock()
	prefix := backend.PresenceKey(election, "")
	var out []backend.Presence
	for key, doc := range l.docs {
		var d presenceDoc
		if !strings.HasPrefix(key, prefix) || json.Unmarshal(doc, &d) != nil || d.Mark != markPresence {
			continue
		}
		p := backend.Presence{Node: d.Node, Value: d.Value, Priority: d.Priority, CanLead: d.CanLead, Token: d.Token,
			Incarnation: d.Incarnation, Timestamp: d.Time, Joined: d.Joined}
		if p.Validate() == nil {
			out = append(out, p)
		}
	}
	return out, l.now(), nil
}
