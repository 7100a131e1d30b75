package rethink

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	r "gopkg.in/rethinkdb/rethinkdb-go.v6"
)

// Fields of an entry of the literal object that a batched update looks its
// document's expected write up in.
const (
	batchRevision = "revision"
	batchLeader   = "leader"
	batchTerm     = "term"
	batchDoc      = "doc"
	// batchKeyPrefix prefixes the election names used as keys of that
	// object: an object with the key "$reql_type$" (a valid election name)
	// is read by the server as a pseudo-type and would fail the whole
	// batch.
	batchKeyPrefix = "e:"
)

// HeartbeatBatch performs the compare-and-set writes of many elections in
// at most three queries, each result exactly what Heartbeat gives for that
// write alone:
//
//   - the renewals and claims on an existing record (expected.Revision > 0)
//     are one query,
//
//     r.expr({"e:"+id: {revision, leader, term, doc}, ...}).do(func(m) {
//     return r.table(t).getAll(ids...).update(func(row) {
//     e := m.getField(r.expr("e:").add(row("id")))
//     return r.branch(casCondition(row, e("revision"), e("leader"), e("term")), e("doc"), r.error(marker))
//     }, {returnChanges: true, durability: "hard"})
//     })
//
//     whose function runs atomically per document, like Heartbeat's;
//
//   - the first claims (expected.Revision 0) are one
//     insert([...], {conflict: "error", returnChanges: true, durability: "hard"});
//
//   - the writes that neither changed (a conflict, a malformed document, a
//     missing one) are read with one getAll, to return a
//     *backend.ConflictError with the current record or an error matching
//     backend.ErrMalformedRecord, per write.
//
// Documents are written one by one, not as one transaction: some writes of
// a batch may be applied and others refused, and each result says which.
// A write that fails validation fails alone. When a query fails (the
// connection broke, ctx ended), its writes get its error, whose outcome is
// unknown as for a Heartbeat that failed; the writes of the other query
// keep their results. Writes naming the same election twice are refused
// from the second on (ErrInvalidConfig).
func (s *Store) HeartbeatBatch(ctx context.Context, writes []backend.Write) ([]backend.WriteResult, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	out := make([]backend.WriteResult, len(writes))
	done := make([]bool, len(writes))
	var inserts, updates []int
	seen := make(heartbeat.Batch, len(writes))
	for i, w := range writes {
		if err := checkWrite(w.Expected, w.Next); err != nil {
			out[i].Err, done[i] = err, true
			continue
		}
		if err := seen.Add(w.Next.Election, i); err != nil {
			out[i].Err = fmt.Errorf("rethink: %s: %w: %w", describe(w.Expected, w.Next), base.ErrInvalidConfig, err)
			done[i] = true
			continue
		}
		if w.Expected.Revision == 0 {
			inserts = append(inserts, i)
		} else {
			updates = append(updates, i)
		}
	}
	firstError := make([]string, len(writes))
	if len(updates) > 0 {
		s.batchWrite(ctx, writes, updates, s.batchUpdate(writes, updates), "batched update", out, done, firstError)
	}
	if len(inserts) > 0 {
		s.batchWrite(ctx, writes, inserts, s.batchInsert(writes, inserts), "batched insert", out, done, firstError)
	}
	var pending []int
	for i := range writes {
		if !done[i] {
			pending = append(pending, i)
		}
	}
	if len(pending) == 0 {
		return out, nil
	}
	// Refused: read what is there to tell a conflict from a malformed
	// document, as Heartbeat does.
	ids := make([]any, len(pending))
	for k, i := range pending {
		ids[k] = writes[i].Next.Election
	}
	docs, err := s.readDocs(ctx, ids)
	for _, i := range pending {
		w := writes[i]
		var (
			cur  heartbeat.Record
			rerr = err
		)
		if err == nil {
			if raw, ok := docs[w.Next.Election]; ok {
				cur, rerr = decodeRecord(w.Next.Election, raw)
			} else {
				rerr = s.notFound(w.Next.Election)
			}
		}
		out[i].Record, out[i].Err = refused(describe(w.Expected, w.Next), firstError[i], w.Expected, w.Next, cur, rerr)
	}
	return out, nil
}

// batchUpdate is the update query of the writes idx, all with
// expected.Revision > 0.
func (s *Store) batchUpdate(writes []backend.Write, idx []int) r.Term {
	ids := make([]any, len(idx))
	expected := make(map[string]any, len(idx))
	for k, i := range idx {
		w := writes[i]
		ids[k] = w.Next.Election
		doc := encodeRecord(w.Next.Election, w.Expected.Revision+1, w.Next)
		delete(doc, fieldID)
		expected[batchKeyPrefix+w.Next.Election] = map[string]any{
			batchRevision: w.Expected.Revision,
			batchLeader:   w.Expected.Leader,
			batchTerm:     w.Expected.Term,
			batchDoc:      doc,
		}
	}
	// r.do binds the object once: looked up in place, it would be built
	// again for every document.
	return r.Expr(expected).Do(func(lookup r.Term) any {
		return s.term().GetAll(ids...).Update(func(row r.Term) any {
			e := lookup.Field(r.Expr(batchKeyPrefix).Add(row.Field(fieldID)))
			return r.Branch(casCondition(row, e.Field(batchRevision), e.Field(batchLeader), e.Field(batchTerm)),
				e.Field(batchDoc), r.Error(conflictMarker))
		}, r.UpdateOpts{ReturnChanges: true, Durability: durability})
	})
}

// batchInsert is the insert query of the writes idx, all with
// expected.Revision 0.
func (s *Store) batchInsert(writes []backend.Write, idx []int) r.Term {
	docs := make([]any, len(idx))
	for k, i := range idx {
		w := writes[i]
		docs[k] = encodeRecord(w.Next.Election, 1, w.Next)
	}
	return s.term().Insert(docs, r.InsertOpts{Conflict: "error", ReturnChanges: true, Durability: durability})
}

// batchWrite runs q, the write of writes idx, and records the stored
// records in out (done) by the id of each change. The writes it did not
// change stay pending, with the server's first error noted. A failed query
// gives each of its writes the error.
func (s *Store) batchWrite(ctx context.Context, writes []backend.Write, idx []int, q r.Term, what string, out []backend.WriteResult, done []bool, firstError []string) {
	what = fmt.Sprintf("%s of %d elections in %s.%s", what, len(idx), s.db, s.table)
	fail := func(err error) {
		for _, i := range idx {
			out[i].Err, done[i] = fmt.Errorf("rethink: %s: %w", describe(writes[i].Expected, writes[i].Next), err), true
		}
	}
	raw, err := s.run(ctx, what, q)
	if err != nil {
		fail(err)
		return
	}
	var wr writeResult
	if err := json.Unmarshal(raw, &wr); err != nil {
		fail(fmt.Errorf("rethink: %s: cannot decode the write result %.200s: %w", what, raw, err))
		return
	}
	stored := make(map[string]json.RawMessage, len(wr.Changes))
	for _, c := range wr.Changes {
		var keyed struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(c.NewVal, &keyed) == nil {
			stored[keyed.ID] = c.NewVal
		}
	}
	for _, i := range idx {
		w := writes[i]
		raw, ok := stored[w.Next.Election]
		if !ok {
			firstError[i] = wr.FirstError
			continue
		}
		rec, err := decodeRecord(w.Next.Election, raw)
		if err != nil {
			err = fmt.Errorf("rethink: %s: the stored record: %w", describe(w.Expected, w.Next), err)
		}
		out[i].Record, out[i].Err, done[i] = rec, err, true
	}
}

// readDocs reads the documents with ids in one query, keyed by id.
func (s *Store) readDocs(ctx context.Context, ids []any) (map[string]json.RawMessage, error) {
	raw, err := s.run(ctx, fmt.Sprintf("batch: reading %d refused elections", len(ids)), s.term().GetAll(ids...).CoerceTo("array"))
	if err != nil {
		return nil, err
	}
	var docs []json.RawMessage
	if err := json.Unmarshal(raw, &docs); err != nil {
		return nil, fmt.Errorf("rethink: batch: cannot decode the documents %.200s: %w", raw, err)
	}
	byID := make(map[string]json.RawMessage, len(docs))
	for _, d := range docs {
		var keyed struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(d, &keyed) == nil {
			byID[keyed.ID] = d
		}
	}
	return byID, nil
}

// GetBatch reads the records of elections with one getAll, each as Get
// would: an election without a document gets ErrNotFound, a malformed
// document fails only its own election.
func (s *Store) GetBatch(ctx context.Context, elections []string) ([]backend.ReadResult, error) {
	out := make([]backend.ReadResult, len(elections))
	index := make(heartbeat.Batch, len(elections))
	ids := make([]any, 0, len(elections))
	for i, e := range elections {
		if err := index.Add(e, i); err != nil {
			out[i].Err = fmt.Errorf("rethink: get batch: %w: %w", base.ErrInvalidConfig, err)
			continue
		}
		ids = append(ids, e)
	}
	if len(ids) == 0 {
		return out, nil
	}
	raw, err := s.run(ctx, fmt.Sprintf("get batch of %d elections", len(ids)), s.term().GetAll(ids...).CoerceTo("array"))
	if err != nil {
		return nil, err
	}
	var docs []json.RawMessage
	if err := json.Unmarshal(raw, &docs); err != nil {
		return nil, fmt.Errorf("rethink: get batch: cannot decode the documents %.200s: %w", raw, err)
	}
	found := make(map[string]bool, len(ids))
	for _, d := range docs {
		var keyed struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(d, &keyed) != nil {
			continue
		}
		i, ok := index[keyed.ID]
		if !ok || found[keyed.ID] {
			continue
		}
		found[keyed.ID] = true
		out[i].Record, out[i].Err = decodeRecord(keyed.ID, d)
	}
	for e, i := range index {
		if !found[e] {
			out[i].Err = s.notFound(e)
		}
	}
	return out, nil
}
