package mongo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/mongo/internal/driver"
)

// subscription is one open change stream.
type subscription struct {
	kill context.CancelFunc // ends the change stream (not the channel)
}

// changeEvent holds the fields of a change event the backend reads.
type changeEvent struct {
	OperationType string        `bson:"operationType"`
	DocumentKey   bson.Raw      `bson:"documentKey"`
	FullDocument  bson.RawValue `bson:"fullDocument"`
}

// streamState is what one subscription remembers between events.
type streamState struct {
	lastRev uint64 // revision of the last RecordChanged; 0 after a deletion
}

// Subscribe opens a change stream on the collection (empty pipeline,
// fullDocument: updateLookup) and returns its notifications; see the
// package documentation for what arrives. The stream resumes after the last
// event a previous subscription of this backend delivered. If that is not
// possible (no token, or the token is no longer valid), the stream starts at
// the present, the record is read again and delivered first, and the gap is
// logged.
//
// The channel is closed when ctx is done, when the backend is closed, or
// after one Failed notification.
func (b *Backend) Subscribe(ctx context.Context) (<-chan base.Notification, error) {
	if err := b.check(ctx, "subscribe"); err != nil {
		return nil, err
	}
	b.mu.Lock()
	token, reopened := b.token, b.opened
	b.mu.Unlock()

	// live ends with ctx or Close; streamCtx also ends on kill.
	live, cancelLive := context.WithCancel(ctx)
	stopAfter := context.AfterFunc(b.closeCtx, cancelLive)
	streamCtx, kill := context.WithCancel(live)
	release := func() {
		kill()
		stopAfter()
		cancelLive()
	}

	stream, err := b.coll.Watch(streamCtx, token)
	gap := reopened && token == nil
	if err != nil && token != nil && errors.Is(err, driver.ErrHistoryLost) {
		b.log.Warn("mongo: resume token no longer valid; starting the change stream at the present", "err", err)
		gap = true
		stream, err = b.coll.Watch(streamCtx, nil)
	}
	if err != nil {
		release()
		return nil, b.opError(ctx, "subscribe: watch", err)
	}

	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		closeStream(stream)
		release()
		return nil, b.errorf("subscribe: %w", base.ErrClosed)
	}
	b.opened = true
	if gap {
		b.token = nil
	}
	if t := stream.ResumeToken(); t != nil {
		b.token = cloneRaw(t)
	}
	sub := &subscription{kill: kill}
	b.subs[sub] = struct{}{}
	b.wg.Add(1)
	b.mu.Unlock()

	var first []base.Notification
	if gap {
		// Changes between the old position and now are lost: re-read the
		// record so that its state is not.
		b.log.Warn("mongo: gap in the change stream: changes to other documents may have been missed; re-reading the election record")
		rec, err := b.get(live) // Close cancels it
		switch {
		case err == nil:
			first = append(first, base.Notification{Type: base.RecordChanged, Record: rec})
		case errors.Is(err, base.ErrNotFound):
			first = append(first, base.Notification{Type: base.RecordDeleted})
		case errors.Is(err, base.ErrMalformedRecord):
			first = append(first, base.Notification{Type: base.Ignored, Err: err})
		default:
			b.mu.Lock()
			delete(b.subs, sub)
			b.mu.Unlock()
			closeStream(stream)
			release()
			b.wg.Done()
			if b.closeCtx.Err() != nil {
				return nil, b.errorf("subscribe: %w", base.ErrClosed)
			}
			return nil, fmt.Errorf("%w (re-reading the record after a gap in the change stream)", err)
		}
	}

	ch := make(chan base.Notification, 16)
	go b.run(live, streamCtx, stream, sub, ch, first, release)
	return ch, nil
}

// run reads the change stream until it ends and sends its notifications
// on ch. Sends give up when live is done.
func (b *Backend) run(live, streamCtx context.Context, stream driver.Stream, sub *subscription,
	ch chan<- base.Notification, first []base.Notification, release func()) {
	defer b.wg.Done()
	defer close(ch)
	defer release()
	defer func() {
		b.mu.Lock()
		delete(b.subs, sub)
		b.mu.Unlock()
	}()
	defer closeStream(stream)

	send := func(n base.Notification) bool {
		select {
		case ch <- n:
			return true
		case <-live.Done():
			return false
		}
	}
	var st streamState
	for _, n := range first {
		if n.Type == base.RecordChanged {
			st.lastRev = n.Record.Revision
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
				b.saveToken(t)
			}
			continue
		}
		var ev changeEvent
		if err := bson.Unmarshal(raw, &ev); err != nil {
			failure = fmt.Errorf("decoding a change event: %w", err)
			break
		}
		if ev.OperationType == "invalidate" {
			b.saveToken(nil) // only startAfter could resume after it
			failure = driver.ErrInvalidated
			break
		}
		if n, ok := b.translate(&ev, &st); ok && !send(n) {
			return
		}
		b.saveToken(stream.ResumeToken())
	}
	if live.Err() != nil {
		return // ctx done or backend closed: no Failed notification
	}
	switch {
	case errors.Is(failure, context.Canceled) && streamCtx.Err() != nil:
		failure = fmt.Errorf("%w: closed", driver.ErrStreamEnded)
	case errors.Is(failure, driver.ErrHistoryLost):
		b.saveToken(nil)
	case errors.Is(failure, driver.ErrEventTooLarge):
		// Resuming from the token before the event would meet it again:
		// the next stream starts at the present, and Subscribe re-reads
		// the record (written from the server's documentation; a test
		// injects the error).
		b.log.Warn("mongo: a change event was larger than 16 MiB; the next change stream starts after it", "err", failure)
		b.saveToken(nil)
	}
	send(base.Notification{Type: base.Failed, Err: fmt.Errorf("mongo: election %q: change stream on %s.%s: %w",
		b.election, b.coll.DatabaseName(), b.collName, failure)})
}

// translate turns a change event into a notification; ok is false when
// there is nothing to deliver.
func (b *Backend) translate(ev *changeEvent, st *streamState) (n base.Notification, ok bool) {
	switch ev.OperationType {
	case "drop", "rename", "dropDatabase":
		// Every document of the collection is gone with it.
		st.lastRev = 0
		return base.Notification{Type: base.RecordDeleted}, true
	case "insert", "update", "replace", "delete":
	default:
		return n, false // an event type this backend does not know
	}
	key := ev.DocumentKey.Lookup("_id")
	if id, isString := key.StringValueOK(); isString && id == b.election {
		return b.translateRecord(ev, st)
	}
	c := base.Change{Table: b.collName, Key: extJSONValue(key)}
	switch ev.OperationType {
	case "insert":
		c.Op = base.Insert
	case "update", "replace":
		c.Op = base.Update
	case "delete":
		c.Op = base.Delete
	}
	if c.Op != base.Delete {
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
	return base.Notification{Type: base.OtherChanged, Change: c}, true
}

func (b *Backend) translateRecord(ev *changeEvent, st *streamState) (base.Notification, bool) {
	if ev.OperationType == "delete" {
		st.lastRev = 0
		return base.Notification{Type: base.RecordDeleted}, true
	}
	doc, ok := ev.FullDocument.DocumentOK()
	if !ok {
		return base.Notification{}, false // updated, then deleted before the lookup: the delete follows
	}
	rec, err := decodeRecord(doc, b.election)
	if err != nil {
		st.lastRev = 0 // the record was overwritten
		return base.Notification{Type: base.Ignored, Err: fmt.Errorf("mongo: election %q: change stream: %w", b.election, err)}, true
	}
	if rec.Revision <= st.lastRev {
		return base.Notification{}, false // already delivered (update lookup)
	}
	st.lastRev = rec.Revision
	return base.Notification{Type: base.RecordChanged, Record: rec}, true
}

func (b *Backend) saveToken(t bson.Raw) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if t == nil {
		b.token = nil
		return
	}
	b.token = cloneRaw(t)
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
