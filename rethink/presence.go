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

// Present inserts or replaces the presence document of p.Node in election,
// stamped with the server's r.Now().
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
	_, err := s.run(ctx, what, s.term().Insert(map[string]any{
		fieldID:        presenceID(election, p.Node),
		fieldMark:      presenceMark,
		fieldElection:  election,
		fieldNode:      p.Node,
		fieldPriority:  p.Priority,
		fieldCanLead:   p.CanLead,
		fieldValue:     value,
		fieldToken:     p.Token,
		fieldTimestamp: r.Now(),
	}, r.InsertOpts{Conflict: "replace", Durability: durability}))
	return err
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
		if p.Validate() == nil {
			out = append(out, p)
		}
	}
	return out, now, nil
}
