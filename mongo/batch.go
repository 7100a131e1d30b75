package mongo

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/mongo/internal/driver"
)

// HeartbeatBatch performs writes, each the compare-and-set of Heartbeat, in
// two round trips: one unordered bulk write of their UpdateOne operations
// (the filters and updates of Heartbeat; a first write, expected revision
// 0, is an upsert), then one find of the documents with their _ids, which
// reads the timestamps $currentDate stored. A write is applied when the
// document read back is the record it wrote (revision expected+1 with
// next's leader, term, value and lease); otherwise it was refused, and its
// result is what Heartbeat returns then: a *backend.ConflictError with the
// current record, or an error matching backend.ErrMalformedRecord when the
// document in its place is malformed (the other writes go on). A write
// that breaks the record rules fails alone with base.ErrInvalidConfig,
// before anything is sent.
//
// On a server both round trips run in one causally consistent session, so
// the find reads the bulk write's effects. A write applied and then
// overwritten by another node before the find reads it is reported as a
// conflict carrying the newer record, as if it had lost: the record it
// wrote was superseded either way.
func (s *Store) HeartbeatBatch(ctx context.Context, writes []backend.Write) ([]backend.WriteResult, error) {
	if err := s.check(ctx, "heartbeat batch"); err != nil {
		return nil, err
	}
	results := make([]backend.WriteResult, len(writes))
	prepared := make([]write, 0, len(writes))
	index := make([]int, 0, len(writes)) // writes index of each prepared write
	seen := make(heartbeat.Batch, len(writes))
	for i, wr := range writes {
		w, err := prepare(wr.Expected, wr.Next)
		if err != nil {
			results[i].Err = err
			continue
		}
		if err := seen.Add(wr.Next.Election, i); err != nil {
			results[i].Err = fmt.Errorf("mongo: %s: %w: %w", w.what, base.ErrInvalidConfig, err)
			continue
		}
		prepared = append(prepared, w)
		index = append(index, i)
	}
	if len(prepared) == 0 {
		return results, nil
	}
	ops := make([]driver.UpdateOp, len(prepared))
	ids := make([]string, len(prepared))
	s.mu.Lock()
	for j, w := range prepared {
		ops[j] = driver.UpdateOp{Filter: w.filter, Update: w.update, Upsert: w.upsert}
		ids[j] = w.next.Election
		s.elections[w.next.Election] = struct{}{}
	}
	s.mu.Unlock()
	res, err := s.coll.UpdateBatch(ctx, ops, ids)
	if err != nil {
		return nil, s.opError(ctx, fmt.Sprintf("heartbeat batch of %d writes", len(ops)), err)
	}
	if len(res.Errs) != len(ops) {
		return nil, fmt.Errorf("mongo: heartbeat batch: the driver returned %d results for %d writes", len(res.Errs), len(ops))
	}
	docs := make(map[string]bson.Raw, len(res.Docs))
	for _, doc := range res.Docs {
		if id, ok := doc.Lookup("_id").StringValueOK(); ok {
			docs[id] = doc
		}
	}
	for j, w := range prepared {
		i := index[j]
		if err := res.Errs[j]; err != nil && !errors.Is(err, driver.ErrDuplicateKey) {
			// Not a lost race: the server refused the op itself.
			results[i].Err = s.opError(ctx, w.what, err)
			continue
		}
		doc := docs[w.next.Election]
		if res.Errs[j] == nil && doc != nil {
			if rec, err := decodeRecord(doc, w.next.Election); err == nil && w.wrote(rec) {
				results[i].Record = rec
				continue
			}
		}
		results[i].Err = w.refused(doc)
	}
	return results, nil
}

// wrote reports whether rec is the record w writes.
func (w write) wrote(rec heartbeat.Record) bool {
	n := w.next
	return rec.Revision == w.expected.Revision+1 && rec.Leader == n.Leader && rec.Term == n.Term &&
		bytes.Equal(rec.Value, n.Value) && heartbeat.LeaseMicros(rec.Lease) == heartbeat.LeaseMicros(n.Lease) && rec.Successor == n.Successor &&
		rec.Handover == n.Handover && rec.Incarnation == n.Incarnation
}

// GetBatch reads the records of elections with one find ({_id: {$in:
// ...}}), each as Get would: an election without a document gets
// ErrNotFound, a malformed document fails only its own election.
func (s *Store) GetBatch(ctx context.Context, elections []string) ([]backend.ReadResult, error) {
	if err := s.check(ctx, "get batch"); err != nil {
		return nil, err
	}
	out := make([]backend.ReadResult, len(elections))
	index := make(heartbeat.Batch, len(elections))
	ids := make([]string, 0, len(elections))
	for i, e := range elections {
		if err := index.Add(e, i); err != nil {
			out[i].Err = fmt.Errorf("mongo: get batch: %w: %w", base.ErrInvalidConfig, err)
			continue
		}
		ids = append(ids, e)
		s.know(e)
	}
	found := make(map[string]bool, len(ids))
	if len(ids) > 0 {
		docs, err := s.coll.Find(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}})
		if err != nil {
			return nil, s.opError(ctx, fmt.Sprintf("get batch of %d elections", len(ids)), err)
		}
		for _, doc := range docs {
			id, ok := doc.Lookup("_id").StringValueOK()
			i, known := index[id]
			if !ok || !known || found[id] {
				continue
			}
			found[id] = true
			rec, err := decodeRecord(doc, id)
			if err != nil {
				out[i].Err = fmt.Errorf("mongo: election %q: get: %w", id, err)
				continue
			}
			out[i].Record = rec
		}
	}
	for e, i := range index {
		if !found[e] {
			out[i].Err = fmt.Errorf("mongo: election %q: get: %w", e, backend.ErrNotFound)
		}
	}
	return out, nil
}
