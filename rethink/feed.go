package rethink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/leaderfeed/leaderfeed/base"
	r "gopkg.in/rethinkdb/rethinkdb-go.v6"
)

// feedBuffer is the capacity of a subscription's channel.
const feedBuffer = 64

// feedItem is one message of a table changefeed, as the server sends it.
type feedItem struct {
	OldVal json.RawMessage `json:"old_val"`
	NewVal json.RawMessage `json:"new_val"`
	State  json.RawMessage `json:"state"`
	Error  json.RawMessage `json:"error"`
}

// Subscribe opens a changefeed on the table. The election document becomes
// RecordChanged (or RecordDeleted, or Ignored when it is malformed); every
// other document becomes OtherChanged, its operation told by old_val and
// new_val (insert: old_val null; delete: new_val null), not by a "type"
// field, which older servers and reqlite do not send. Documents of other
// elections in the same table (marked with the field "leaderfeed") are left
// out. The changefeed is established on the server when Subscribe returns.
//
// The channel closes when ctx is done or the backend is closed, or after
// one Failed notification when the changefeed breaks or the server reports
// that it skipped changes.
func (b *Backend) Subscribe(ctx context.Context) (<-chan base.Notification, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(b.closeCtx, cancel)
	what := fmt.Sprintf("changefeed on %s.%s", b.db, b.table)
	cur, err := b.term().Changes(r.ChangesOpts{IncludeStates: true}).Run(b.session, r.RunOpts{Context: sctx})
	if err != nil {
		stop()
		cancel()
		return nil, b.wrap(ctx, what, err)
	}
	ch := make(chan base.Notification, feedBuffer)
	b.subs.Add(1)
	go func() {
		defer b.subs.Done()
		defer close(ch)
		defer cancel()
		defer stop()
		defer cur.Close()
		err := b.pump(sctx, cur, ch)
		if sctx.Err() != nil {
			// Cancelled by the caller or by Close: end without Failed.
			return
		}
		select {
		case ch <- base.Notification{Type: base.Failed, Err: fmt.Errorf("rethink: %s: %w", what, err)}:
		case <-sctx.Done():
		}
	}()
	return ch, nil
}

// pump reads the changefeed until it ends and returns why.
func (b *Backend) pump(ctx context.Context, cur *r.Cursor, ch chan<- base.Notification) error {
	for {
		raw, ok := cur.NextResponse()
		if !ok {
			if err := cur.Err(); err != nil {
				return err
			}
			return errors.New("the server ended the changefeed")
		}
		n, ok, err := b.notification(raw)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		select {
		case ch <- n:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// notification turns one changefeed message into a notification; ok is
// false for messages that carry none (states). An error ends the feed.
func (b *Backend) notification(raw json.RawMessage) (n base.Notification, ok bool, err error) {
	var it feedItem
	if err := json.Unmarshal(raw, &it); err != nil {
		return n, false, fmt.Errorf("cannot decode a changefeed message %.200s: %w", raw, err)
	}
	if !isNull(it.Error) {
		// For example "Changefeed cache over array size limit, skipped N
		// elements": changes were lost, so the feed must be reopened.
		return n, false, fmt.Errorf("the server reported %s", it.Error)
	}
	if isNull(it.OldVal) && isNull(it.NewVal) {
		return n, false, nil // a state message, or nothing at all
	}
	doc := it.NewVal
	if isNull(doc) {
		doc = it.OldVal
	}
	var keyed struct {
		ID json.RawMessage `json:"id"`
	}
	if err := json.Unmarshal(doc, &keyed); err != nil || isNull(keyed.ID) {
		return n, false, fmt.Errorf("changefeed message without a document id: %.200s", raw)
	}
	var id string
	if json.Unmarshal(keyed.ID, &id) == nil && id == b.election {
		switch {
		case isNull(it.NewVal):
			return base.Notification{Type: base.RecordDeleted}, true, nil
		default:
			rec, err := decodeRecord(b.election, it.NewVal)
			if err != nil {
				return base.Notification{Type: base.Ignored, Err: err}, true, nil
			}
			return base.Notification{Type: base.RecordChanged, Record: rec}, true, nil
		}
	}
	if isElectionDoc(doc) {
		// Another election's document in the same table: not the caller's
		// data, and with many elections in one table reporting them would
		// multiply the traffic.
		return n, false, nil
	}
	c := base.Change{Table: b.table, Key: keyed.ID, Op: base.Update}
	if !isNull(it.OldVal) {
		c.Old = it.OldVal
	} else {
		c.Op = base.Insert
	}
	if !isNull(it.NewVal) {
		c.New = it.NewVal
	} else {
		c.Op = base.Delete
	}
	return base.Notification{Type: base.OtherChanged, Change: c}, true, nil
}

// isElectionDoc reports whether doc carries the mark of an election
// document (of any election).
func isElectionDoc(doc json.RawMessage) bool {
	var m struct {
		Mark json.RawMessage `json:"leaderfeed"`
	}
	if json.Unmarshal(doc, &m) != nil {
		return false
	}
	var n json.Number
	return unmarshalNumber(m.Mark, &n) == nil && n.String() == "1"
}
