package rethink

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	r "gopkg.in/rethinkdb/rethinkdb-go.v6"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
)

var _ backend.PresenceStore = (*Store)(nil)

// Fields of a presence document. A presence document lives in the table of
// the election documents, marked 2, under presenceID: a key with a
// control character, which no election name has, so it never is an
// election's, and the changefeed's reader skips it (a refresh wakes
// nobody).
const (
	presenceMark  = 2
	fieldElection = "election"
	fieldNode     = "node"
	fieldPriority = "priority"
	fieldCanLead  = "can_lead"
	fieldToken    = "token" // missing in documents of older versions: 0
	// fieldJoined is when the document's incarnation (fieldIncarnation,
	// as in an election document) first wrote it: backend.Presence.Joined.
	// Both are missing in documents of older versions: no joined time,
	// incarnation 0.
	fieldJoined = "joined"
)

// presenceID is the primary key of node's presence document in election:
// backend.PresenceKey when it fits RethinkDB's primary keys (127 bytes), else
// the separator and the SHA-256 of it in hex.
func presenceID(election, node string) string {
	k := backend.PresenceKey(election, node)
	if len(k) <= 127 {
		return k
	}
	sum := sha256.Sum256([]byte(k))
	return backend.PresenceSep + hex.EncodeToString(sum[:])
}

// presentAttempts bounds the rounds of Present's fallback (see Present);
// another round is needed only when a write of the same document came
// between its queries.
const presentAttempts = 3

// Present inserts or replaces the presence document of p.Node in election,
// stamped with the server's r.Now(), in one get(id).replace(func): a
// single-document write that the server runs atomically, and an insert
// when there is no document. r.now() is one value in a query, so the
// function keeps the stored joined time when the stored document is of
// p.Incarnation, and sets it to the write's timestamp otherwise.
//
// reqlite, the stand-in of the tests, skips a replace of a missing
// document instead of inserting it; Present then inserts the document
// (conflict "error"), and replaces again if a write of the same document
// came in between. A real RethinkDB never takes that path.
func (s *Store) Present(ctx context.Context, election string, p backend.Presence) error {
	if err := checkElection(election); err != nil {
		return err
	}
	if err := p.Validate(); err != nil {
		return fmt.Errorf("rethink: presence of %q: %w: %w", p.Node, base.ErrInvalidConfig, err)
	}
	var value any
	if len(p.Value) > 0 {
		value = r.Binary(p.Value)
	}
	what := fmt.Sprintf("election %q: presence of %q", election, p.Node)
	id := presenceID(election, p.Node)
	doc := func(joined any) map[string]any {
		return map[string]any{
			fieldID:          id,
			fieldMark:        presenceMark,
			fieldElection:    election,
			fieldNode:        p.Node,
			fieldPriority:    p.Priority,
			fieldCanLead:     p.CanLead,
			fieldValue:       value,
			fieldToken:       p.Token,
			fieldIncarnation: p.Incarnation,
			fieldTimestamp:   r.Now(),
			fieldJoined:      joined,
		}
	}
	// The joined time is r.Now() plus nothing: the same instant as the
	// timestamp, as a TIME of its own. reqlite keeps one object for every
	// r.now() of a query and replaces a stored TIME in place, so a joined
	// time that shared the timestamp's object would move with every
	// refresh; a real server stores values.
	now := r.Now().Add(0)
	replace := s.term().Get(id).Replace(func(old r.Term) any {
		return doc(r.Branch(old.Eq(nil), now,
			r.Branch(old.Field(fieldIncarnation).Default(0).Eq(p.Incarnation), old.Field(fieldJoined).Default(nil), now)))
	}, r.ReplaceOpts{Durability: durability})
	insert := s.term().Insert(doc(now), r.InsertOpts{Conflict: "error", Durability: durability})
	var wr writeResult
	for range presentAttempts {
		if err := s.write(ctx, what, replace, &wr); err != nil {
			return err
		}
		if wr.Errors > 0 {
			return fmt.Errorf("rethink: %s: %s", what, wr.FirstError)
		}
		if wr.Skipped == 0 {
			return nil
		}
		if err := s.write(ctx, what, insert, &wr); err != nil {
			return err
		}
		if wr.Inserted == 1 {
			return nil
		}
		// A duplicate primary key: the document was written meanwhile.
	}
	return fmt.Errorf("rethink: %s: other writes of the document came between its queries %d times: %s", what, presentAttempts, wr.FirstError)
}

// write runs the write q and decodes its result into wr.
func (s *Store) write(ctx context.Context, what string, q r.Term, wr *writeResult) error {
	raw, err := s.run(ctx, what, q)
	if err != nil {
		return err
	}
	*wr = writeResult{}
	if err := json.Unmarshal(raw, wr); err != nil {
		return fmt.Errorf("rethink: %s: cannot decode the write result %.200s: %w", what, raw, err)
	}
	return nil
}

// Absent deletes the presence document of node in election.
func (s *Store) Absent(ctx context.Context, election, node string) error {
	_, err := s.run(ctx, fmt.Sprintf("election %q: absence of %q", election, node),
		s.term().Get(presenceID(election, node)).Delete(r.DeleteOpts{Durability: durability}))
	return err
}

// Participants returns the presence documents of election and the
// server's r.Now(), in one query. Documents that do not decode are left
// out.
func (s *Store) Participants(ctx context.Context, election string) ([]backend.Presence, time.Time, error) {
	if err := checkElection(election); err != nil {
		return nil, time.Time{}, err
	}
	what := fmt.Sprintf("election %q: participants", election)
	raw, err := s.run(ctx, what, r.Expr(map[string]any{
		"now": r.Now(),
		"docs": s.term().Filter(func(row r.Term) r.Term {
			return row.Field(fieldMark).Default(nil).Eq(presenceMark).And(row.Field(fieldElection).Default(nil).Eq(election))
		}).CoerceTo("array"),
	}))
	if err != nil {
		return nil, time.Time{}, err
	}
	var res struct {
		Now  json.RawMessage              `json:"now"`
		Docs []map[string]json.RawMessage `json:"docs"`
	}
	if err := json.Unmarshal(raw, &res); err != nil {
		return nil, time.Time{}, fmt.Errorf("rethink: %s: cannot decode %.200s: %w", what, raw, err)
	}
	now, err := decodeTime(res.Now)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("rethink: %s: the server's time: %w", what, err)
	}
	var out []backend.Presence
	for _, d := range res.Docs {
		var p backend.Presence
		var prio json.Number
		if unmarshalString(d[fieldNode], &p.Node) != nil || unmarshalNumber(d[fieldPriority], &prio) != nil ||
			json.Unmarshal(d[fieldCanLead], &p.CanLead) != nil {
			continue
		}
		n, err := prio.Int64()
		if err != nil {
			continue
		}
		p.Priority = int(n)
		if p.Timestamp, err = decodeTime(d[fieldTimestamp]); err != nil {
			continue
		}
		if p.Value, err = decodeBinary(d[fieldValue]); err != nil {
			continue
		}
		if raw := d[fieldToken]; !isNull(raw) {
			token, err := decodeInt(raw)
			if err != nil || token < 0 {
				continue
			}
			p.Token = uint64(token)
		}
		if raw := d[fieldIncarnation]; !isNull(raw) {
			incarnation, err := decodeInt(raw)
			if err != nil || incarnation < 0 {
				continue
			}
			p.Incarnation = uint64(incarnation)
		}
		// A joined time that is not a TIME (a foreign write, which the
		// refreshes of the incarnation would keep) reads as none, as a
		// missing one does.
		p.Joined, _ = decodeTime(d[fieldJoined])
		if p.Validate() == nil {
			out = append(out, p)
		}
	}
	return out, now, nil
}
