package mongo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/mongo/internal/driver"
)

// subscription is one open change stream.
type subscription struct {
	kill context.CancelFunc // ends the change stream (not the channel)
}

// changeEvent holds the fields of a change event the store reads.
type changeEvent struct {
	OperationType string        `bson:"operationType"`
	DocumentKey   bson.Raw      `bson:"documentKey"`
	FullDocument  bson.RawValue `bson:"fullDocument"`
	// UpdateDescription tells a fence's write (fenceOnly) from the
	// record's.
	UpdateDescription struct {
		UpdatedFields bson.Raw `bson:"updatedFields"`
		RemovedFields bson.Raw `bson:"removedFields"`
	} `bson:"updateDescription"`
}

// streamState is what one subscription remembers between events.
type streamState struct {
	// lastRev is the revision of each election's last RecordChanged;
	// missing after a deletion.
	lastRev map[string]uint64
}

func newStreamState() *streamState { return &streamState{lastRev: map[string]uint64{}} }

// Subscribe opens one change stream on the collection (empty pipeline,
// fullDocument: updateLookup) for every election and returns its
// notifications; see the package documentation for what arrives. The
// stream resumes after the last event a previous subscription of this
// store delivered. If that is not possible (no token, or the token is no
// longer valid), the stream starts at the present, the election documents
// are read again and delivered first, and the gap is logged.
//
// The store sends on the channel and blocks while nobody reads; it queues
// and coalesces nothing. The channel is closed when ctx is done, when the
// store is closed, or after one Failed notification.
func (s *Store) Subscribe(ctx context.Context) (<-chan backend.Notification, error) {
	if err := s.check(ctx, "subscribe"); err != nil {
		return nil, err
	}
	s.mu.Lock()
	token, reopened := s.token, s.opened
	s.mu.Unlock()

	// live ends with ctx or Close; streamCtx also ends on kill.
	live, cancelLive := context.WithCancel(ctx)
	stopAfter := context.AfterFunc(s.closeCtx, cancelLive)
	streamCtx, kill := context.WithCancel(live)
	release := func() {
		kill()
		stopAfter()
		cancelLive()
	}

	stream, err := s.coll.Watch(streamCtx, token)
	gap := reopened && token == nil
	if err != nil && token != nil && errors.Is(err, driver.ErrHistoryLost) {
		s.log.Warn("mongo: resume token no longer valid; starting the change stream at the present", "err", err)
		gap = true
		stream, err = s.coll.Watch(streamCtx, nil)
	}
	if err != nil {
		release()
		return nil, s.opError(ctx, "subscribe: watch", err)
	}

	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		closeStream(stream)
		release()
		return nil, fmt.Errorf("mongo: subscribe: %w", base.ErrClosed)
	}
	s.opened = true
	if gap {
		s.token = nil
	}
	if t := stream.ResumeToken(); t != nil {
		s.token = cloneRaw(t)
	}
	sub := &subscription{kill: kill}
	s.subs[sub] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()

	st := newStreamState()
	var first []backend.Notification
	if !reopened || gap {
		// Learn which documents are election records (so that their
		// deletions are told from the caller's), and after a gap deliver
		// them: changes between the old position and now are lost, the
		// records' state is not.
		if gap {
			s.log.Warn("mongo: gap in the change stream: changes to other documents may have been missed; re-reading the election records")
		}
		first, err = s.reread(live, gap) // Close cancels it
		if err != nil {
			s.mu.Lock()
			delete(s.subs, sub)
			s.mu.Unlock()
			closeStream(stream)
			release()
			s.wg.Done()
			if s.closeCtx.Err() != nil {
				return nil, fmt.Errorf("mongo: subscribe: %w", base.ErrClosed)
			}
			return nil, fmt.Errorf("%w (reading the election records as the change stream opened)", err)
		}
	}

	ch := make(chan backend.Notification)
	go s.run(live, streamCtx, stream, sub, ch, st, first, release)
	return ch, nil
}

// reread reads every document with the election mark, adds their _ids to
// the known elections, and with deliver returns them as notifications
// (RecordChanged or Ignored), with RecordDeleted for every known election
// that has no document.
func (s *Store) reread(ctx context.Context, deliver bool) ([]backend.Notification, error) {
	docs, err := s.coll.Find(ctx, bson.D{{Key: fieldMark, Value: bson.D{{Key: "$exists", Value: true}}}})
	if err != nil {
		return nil, s.opError(ctx, "subscribe: read the election records", err)
	}
	var out []backend.Notification
	found := map[string]bool{}
	for _, doc := range docs {
		id, ok := doc.Lookup("_id").StringValueOK()
		if !ok {
			continue // not keyed by a name: no election's
		}
		found[id] = true
		if deliver {
			out = append(out, s.recordNotification(id, doc))
		}
	}
	s.mu.Lock()
	var gone []string
	for id := range s.elections {
		if !found[id] {
			gone = append(gone, id)
		}
	}
	for id := range found {
		s.elections[id] = struct{}{}
	}
	s.mu.Unlock()
	if deliver {
		slices.Sort(gone)
		for _, id := range gone {
			raw, err := s.coll.FindOne(ctx, id)
			switch {
			case errors.Is(err, driver.ErrNoDocument):
				out = append(out, backend.Notification{Type: backend.RecordDeleted, Election: id})
			case err != nil:
				return nil, s.opError(ctx, fmt.Sprintf("subscribe: read election %q", id), err)
			default: // a document without the mark
				out = append(out, s.recordNotification(id, raw))
			}
		}
	}
	return out, nil
}

// recordNotification returns the notification of the document doc of
// election id: RecordChanged, or Ignored when it is malformed.
func (s *Store) recordNotification(id string, doc bson.Raw) backend.Notification {
	rec, err := decodeRecord(doc, id)
	if err != nil {
		return backend.Notification{Type: backend.Ignored, Election: id,
			Err: fmt.Errorf("mongo: election %q: change stream: %w", id, err)}
	}
	return backend.Notification{Type: backend.RecordChanged, Record: rec}
}

// run reads the change stream until it ends and sends its notifications
// on ch. Sends give up when live is done.
func (s *Store) run(live, streamCtx context.Context, stream driver.Stream, sub *subscription,
	ch chan<- backend.Notification, st *streamState, first []backend.Notification, release func()) {
	defer s.wg.Done()
	defer close(ch)
	defer release()
	defer func() {
		s.mu.Lock()
		delete(s.subs, sub)
		s.mu.Unlock()
	}()
	defer closeStream(stream)

	send := func(n backend.Notification) bool {
		select {
		case ch <- n:
			return true
		case <-live.Done():
			return false
		}
	}
	for _, n := range first {
		if n.Type == backend.RecordChanged {
			st.lastRev[n.Record.Election] = n.Record.Revision
		}
		if !send(n) {
			return
		}
	}

	var failure error
	for {
		raw, err := stream.Next(streamCtx)
		if err != nil {
			failure = err
			break
		}
		if raw == nil { // an empty batch: keep its postBatchResumeToken
			if t := stream.ResumeToken(); t != nil {
				s.saveToken(t)
			}
			continue
		}
		var ev changeEvent
		if err := bson.Unmarshal(raw, &ev); err != nil {
			failure = fmt.Errorf("decoding a change event: %w", err)
			break
		}
		if ev.OperationType == "invalidate" {
			s.saveToken(nil) // only startAfter could resume after it
			failure = driver.ErrInvalidated
			break
		}
		for _, n := range s.translate(&ev, st) {
			if !send(n) {
				return
			}
		}
		s.saveToken(stream.ResumeToken())
	}
	if live.Err() != nil {
		return // ctx done or store closed: no Failed notification
	}
	switch {
	case errors.Is(failure, context.Canceled) && streamCtx.Err() != nil:
		failure = fmt.Errorf("%w: closed", driver.ErrStreamEnded)
	case errors.Is(failure, driver.ErrHistoryLost):
		s.saveToken(nil)
	case errors.Is(failure, driver.ErrEventTooLarge):
		// Resuming from the token before the event would meet it again:
		// the next stream starts at the present, and Subscribe re-reads
		// the records (written from the server's documentation; a test
		// injects the error).
		s.log.Warn("mongo: a change event was larger than 16 MiB; the next change stream starts after it", "err", failure)
		s.saveToken(nil)
	}
	send(backend.Notification{Type: backend.Failed, Err: s.refusal(fmt.Sprintf("mongo: change stream on %s.%s",
		s.coll.DatabaseName(), s.collName), failure)})
}

// translate turns a change event into notifications (none, when there is
// nothing to deliver).
func (s *Store) translate(ev *changeEvent, st *streamState) []backend.Notification {
	switch ev.OperationType {
	case "drop", "rename", "dropDatabase":
		// Every document of the collection is gone with it.
		s.mu.Lock()
		ids := make([]string, 0, len(s.elections))
		for id := range s.elections {
			ids = append(ids, id)
		}
		s.mu.Unlock()
		slices.Sort(ids)
		out := make([]backend.Notification, len(ids))
		for i, id := range ids {
			out[i] = backend.Notification{Type: backend.RecordDeleted, Election: id}
		}
		clear(st.lastRev)
		return out
	case "insert", "update", "replace", "delete":
	default:
		return nil // an event type this store does not know
	}
	if fenceOnly(ev) {
		return nil // a fence changes no field of the record: nothing to tell
	}
	key := ev.DocumentKey.Lookup("_id")
	if id, isString := key.StringValueOK(); isString && backend.IsPresenceKey(id) {
		return nil // a participant's refresh wakes nobody
	}
	if id, isString := key.StringValueOK(); isString {
		doc, hasDoc := ev.FullDocument.DocumentOK()
		marked := hasDoc && doc.Lookup(fieldMark).Type != 0
		if marked {
			s.know(id)
		}
		if marked || s.isElection(id) {
			if n, ok := s.translateRecord(id, ev, st); ok {
				return []backend.Notification{n}
			}
			return nil
		}
	}
	c := backend.Change{Table: s.collName, Key: extJSONValue(key)}
	switch ev.OperationType {
	case "insert":
		c.Op = backend.Insert
	case "update", "replace":
		c.Op = backend.Update
	case "delete":
		c.Op = backend.Delete
	}
	if c.Op != backend.Delete {
		if doc, isDoc := ev.FullDocument.DocumentOK(); isDoc {
			js, err := bson.MarshalExtJSON(doc, false, false)
			if err == nil {
				c.New = js
			} else {
				c.Partial = true
			}
		} else {
			c.Partial = true // updated, then deleted before the lookup
		}
	}
	return []backend.Notification{{Type: backend.OtherChanged, Change: c}}
}

// translateRecord translates an event of the document of election id.
func (s *Store) translateRecord(id string, ev *changeEvent, st *streamState) (backend.Notification, bool) {
	if ev.OperationType == "delete" {
		delete(st.lastRev, id)
		return backend.Notification{Type: backend.RecordDeleted, Election: id}, true
	}
	doc, ok := ev.FullDocument.DocumentOK()
	if !ok {
		return backend.Notification{}, false // updated, then deleted before the lookup: the delete follows
	}
	n := s.recordNotification(id, doc)
	if n.Type != backend.RecordChanged {
		delete(st.lastRev, id) // the record was overwritten
		return n, true
	}
	if n.Record.Revision <= st.lastRev[id] {
		return backend.Notification{}, false // already delivered (update lookup)
	}
	st.lastRev[id] = n.Record.Revision
	return n, true
}

func (s *Store) saveToken(t bson.Raw) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t == nil {
		s.token = nil
		return
	}
	s.token = cloneRaw(t)
}

func closeStream(s driver.Stream) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = s.Close(ctx)
}

func cloneRaw(r bson.Raw) bson.Raw { return append(bson.Raw(nil), r...) }

// extJSONValue returns v as relaxed extended JSON.
func extJSONValue(v bson.RawValue) json.RawMessage {
	if v.Type == 0 {
		return json.RawMessage("null")
	}
	js, err := bson.MarshalExtJSON(bson.D{{Key: "k", Value: v}}, false, false)
	if err != nil {
		return json.RawMessage("null")
	}
	var w struct {
		K json.RawMessage `json:"k"`
	}
	if json.Unmarshal(js, &w) != nil || w.K == nil {
		return json.RawMessage("null")
	}
	return w.K
}
