package rethink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/leaderfeed/leaderfeed/base/backend"
	r "gopkg.in/rethinkdb/rethinkdb-go.v6"
)

// feedItem is one message of a table changefeed, as the server sends it.
type feedItem struct {
	OldVal json.RawMessage `json:"old_val"`
	NewVal json.RawMessage `json:"new_val"`
	State  json.RawMessage `json:"state"`
	Error  json.RawMessage `json:"error"`
}

// Subscribe opens one changefeed on the table, for every election in it.
// A document is an election document when it has the field "leaderfeed"
// (the mark) and a string id, the election's name; a change in which the
// old or the new document is one is a change of that election's record:
// RecordChanged when the new document is a well-formed election document,
// Ignored (Election set, Err matching backend.ErrMalformedRecord) when it is
// malformed or lost its mark, RecordDeleted (Election set) when it was
// deleted. Every other document is the application's and becomes
// OtherChanged, its operation told by old_val and new_val (insert: old_val
// null; delete: new_val null), not by a "type" field, which older servers
// and reqlite do not send. The changefeed is established on the server
// when Subscribe returns.
//
// Notifications are sent as the server sends them (commit order per
// document), blocking until read: nothing is queued or coalesced here.
// RethinkDB sends whole documents, so no record is too large for it. The
// channel closes when ctx is done or the store is closed, or after one
// Failed notification when the changefeed breaks or the server reports
// that it skipped changes.
func (s *Store) Subscribe(ctx context.Context) (<-chan backend.Notification, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.closeCtx, cancel)
	what := fmt.Sprintf("changefeed on %s.%s", s.db, s.table)
	cur, err := s.term().Changes(r.ChangesOpts{IncludeStates: true}).Run(s.session, r.RunOpts{Context: sctx})
	if err != nil {
		stop()
		cancel()
		return nil, s.wrap(ctx, what, err)
	}
	ch := make(chan backend.Notification)
	s.subs.Add(1)
	go func() {
		defer s.subs.Done()
		defer close(ch)
		defer cancel()
		defer stop()
		defer cur.Close()
		err := s.pump(sctx, cur, ch)
		if sctx.Err() != nil {
			// Cancelled by the caller or by Close: end without Failed.
			return
		}
		select {
		case ch <- backend.Notification{Type: backend.Failed, Err: s.refusal("rethink: "+what, err)}:
		case <-sctx.Done():
		}
	}()
	return ch, nil
}

// pump reads the changefeed until it ends and returns why.
func (s *Store) pump(ctx context.Context, cur *r.Cursor, ch chan<- backend.Notification) error {
	for {
		raw, ok := cur.NextResponse()
		if !ok {
			if err := cur.Err(); err != nil {
				return err
			}
			return errors.New("the server ended the changefeed")
		}
		n, ok, err := s.notification(raw)
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
func (s *Store) notification(raw json.RawMessage) (n backend.Notification, ok bool, err error) {
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
	var election string
	if json.Unmarshal(keyed.ID, &election) == nil && backend.IsPresenceKey(election) {
		return n, false, nil // a participant's refresh wakes nobody
	}
	if json.Unmarshal(keyed.ID, &election) == nil && (isElectionDoc(it.NewVal) || isElectionDoc(it.OldVal)) {
		switch {
		case isNull(it.NewVal):
			return backend.Notification{Type: backend.RecordDeleted, Election: election}, true, nil
		default:
			rec, err := decodeRecord(election, it.NewVal)
			if err != nil {
				return backend.Notification{Type: backend.Ignored, Election: election, Err: err}, true, nil
			}
			return backend.Notification{Type: backend.RecordChanged, Record: rec}, true, nil
		}
	}
	c := backend.Change{Table: s.table, Key: keyed.ID, Op: backend.Update}
	if !isNull(it.OldVal) {
		c.Old = it.OldVal
	} else {
		c.Op = backend.Insert
	}
	if !isNull(it.NewVal) {
		c.New = it.NewVal
	} else {
		c.Op = backend.Delete
	}
	return backend.Notification{Type: backend.OtherChanged, Change: c}, true, nil
}

// isElectionDoc reports whether doc carries the mark field of an election
// document, of any value: a document of another format version, or with a
// malformed mark, is an election's malformed record, not the
// application's.
func isElectionDoc(doc json.RawMessage) bool {
	if isNull(doc) {
		return false
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(doc, &m) != nil {
		return false
	}
	mark, ok := m[fieldMark]
	return ok && !isNull(mark)
}
