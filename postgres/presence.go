package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

var (
	_ backend.PresenceStore      = (*Store)(nil)
	_ backend.PresenceBatchStore = (*Store)(nil)
)

// presenceValue is what the value column of a presence row holds, as JSON.
//
// A presence row lives in the election table under backend.PresenceKey
// (election, chr(31), node): no election name holds a control character,
// so it never is an election's row, and the trigger function announces
// nothing of it (a refresh notifies nobody); Present and Absent set
// notifiedSetting, so that the function does not even run for them. Its
// leader column is the node id, its ts the server's clock_timestamp() of
// the last refresh, its incarnation column the participant's incarnation
// and its joined column when that incarnation first wrote the row (NULL in
// rows of versions before it, and in election rows); term and revision
// are 0. PresentBatch sets notifiedSetting in the same way.
type presenceValue struct {
	Priority int    `json:"p"`
	CanLead  bool   `json:"c"`
	Value    []byte `json:"v,omitempty"`
	Token    uint64 `json:"k,omitempty"`
}

// presentUpdate is the ON CONFLICT DO UPDATE of a presence write, whose
// row is t and whose write is excluded: it replaces the fields and stamps
// ts with the server's clock, read once (the subquery) after the row is
// locked; joined is that same instant when the write's incarnation is
// not the row's, and stays when it is. The row's old incarnation and
// joined are read under the lock of the one statement: two writes of one
// node cannot both take the row for theirs.
const presentUpdate = " SET leader = excluded.leader, value = excluded.value, incarnation = excluded.incarnation," +
	" (ts, joined) = (SELECT n.now, CASE WHEN t.incarnation = excluded.incarnation THEN t.joined ELSE n.now END" +
	" FROM (SELECT clock_timestamp() AS now) AS n)"

// presenceCols are the columns of a presence row (alias t) that
// Participants and ParticipantsBatch read, in the order presenceRow takes
// them. A ts that is not finite reads as NULL, so that the row is left
// out (a time.Time cannot hold it: scanned, it failed the whole read); a
// joined that is not finite reads as none.
const presenceCols = "t.leader, t.value, CASE WHEN isfinite(t.ts) THEN t.ts END, t.incarnation, CASE WHEN isfinite(t.joined) THEN t.joined END"

// Present upserts the presence row of p.Node in election, stamped with the
// server's clock, setting or keeping its joined time (presentUpdate): one
// statement.
func (s *Store) Present(ctx context.Context, election string, p backend.Presence) error {
	if s.closed.Load() {
		return fmt.Errorf("postgres: Present: %w", base.ErrClosed)
	}
	if err := checkPresence(election, p); err != nil {
		return err
	}
	v, err := json.Marshal(presenceValue{Priority: p.Priority, CanLead: p.CanLead, Value: p.Value, Token: p.Token})
	if err != nil {
		return fmt.Errorf("postgres: Present: %w", err)
	}
	_, err = s.pool.Exec(ctx, s.presentSQL, backend.PresenceKey(election, p.Node), p.Node, v, int64(p.Incarnation))
	if err != nil {
		return s.wrapErr(ctx, "postgres: Present", err)
	}
	return nil
}

// PresentBatch upserts the presence rows of writes in one statement
// (INSERT ... SELECT ... FROM unnest(...) ON CONFLICT DO UPDATE), each as
// Present would: stamped with the server's clock_timestamp(), announced
// to nobody. A write that breaks the rules of backend.PresenceBatch fails
// alone and is not sent. An error with nil results means the outcome of
// every write is unknown.
func (s *Store) PresentBatch(ctx context.Context, writes []backend.PresenceWrite) ([]error, error) {
	if s.closed.Load() {
		return nil, fmt.Errorf("postgres: PresentBatch: %w", base.ErrClosed)
	}
	out := make([]error, len(writes))
	seen := make(backend.PresenceBatch, len(writes))
	keys := make([]string, 0, len(writes))
	nodes := make([]string, 0, len(writes))
	values := make([][]byte, 0, len(writes))
	incarnations := make([]int64, 0, len(writes))
	for i, w := range writes {
		if err := seen.Add(w, i); err != nil {
			out[i] = fmt.Errorf("postgres: PresentBatch: %w: %w", base.ErrInvalidConfig, err)
			continue
		}
		p := w.Presence
		v, err := json.Marshal(presenceValue{Priority: p.Priority, CanLead: p.CanLead, Value: p.Value, Token: p.Token})
		if err != nil {
			out[i] = fmt.Errorf("postgres: PresentBatch: %w", err)
			continue
		}
		keys = append(keys, backend.PresenceKey(w.Election, p.Node))
		nodes = append(nodes, p.Node)
		values = append(values, v)
		incarnations = append(incarnations, int64(p.Incarnation))
	}
	if len(keys) == 0 {
		return out, nil
	}
	if _, err := s.pool.Exec(ctx, s.presentBatchSQL, keys, nodes, values, incarnations); err != nil {
		return nil, s.wrapErr(ctx, "postgres: PresentBatch", err)
	}
	return out, nil
}

func checkPresence(election string, p backend.Presence) error {
	if err := heartbeat.ValidateName("election name", election); err != nil {
		return fmt.Errorf("postgres: Present: %w: %w", base.ErrInvalidConfig, err)
	}
	if err := p.Validate(); err != nil {
		return fmt.Errorf("postgres: Present: %w: %w", base.ErrInvalidConfig, err)
	}
	return nil
}

// Absent deletes the presence row of node in election.
func (s *Store) Absent(ctx context.Context, election, node string) error {
	if s.closed.Load() {
		return fmt.Errorf("postgres: Absent: %w", base.ErrClosed)
	}
	if _, err := s.pool.Exec(ctx, s.absentSQL, backend.PresenceKey(election, node)); err != nil {
		return s.wrapErr(ctx, "postgres: Absent", err)
	}
	return nil
}

// Participants returns the presence rows of election and the server's
// clock, in one statement. Rows that do not decode are left out.
func (s *Store) Participants(ctx context.Context, election string) ([]backend.Presence, time.Time, error) {
	if s.closed.Load() {
		return nil, time.Time{}, fmt.Errorf("postgres: Participants: %w", base.ErrClosed)
	}
	if err := heartbeat.ValidateName("election name", election); err != nil {
		return nil, time.Time{}, fmt.Errorf("postgres: Participants: %w: %w", base.ErrInvalidConfig, err)
	}
	rows, err := s.pool.Query(ctx, s.participantsSQL, election)
	if err != nil {
		return nil, time.Time{}, s.wrapErr(ctx, "postgres: Participants", err)
	}
	defer rows.Close()
	var (
		now time.Time
		out []backend.Presence
		r   presenceRow
	)
	for rows.Next() {
		if err := rows.Scan(append([]any{&now}, r.dest()...)...); err != nil {
			return nil, time.Time{}, s.wrapErr(ctx, "postgres: Participants", err)
		}
		if p, ok := r.presence(); ok {
			out = append(out, p)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, time.Time{}, s.wrapErr(ctx, "postgres: Participants", err)
	}
	return out, now, nil
}

// ParticipantsBatch returns the presence rows of elections and the
// server's clock, in one statement (one pass over the table: a row's
// election is its key up to chr(31)), each election's as Participants
// would. A bad or repeated name fails alone; rows that do not decode are
// left out.
func (s *Store) ParticipantsBatch(ctx context.Context, elections []string) ([]backend.ParticipantsResult, error) {
	if s.closed.Load() {
		return nil, fmt.Errorf("postgres: ParticipantsBatch: %w", base.ErrClosed)
	}
	out := make([]backend.ParticipantsResult, len(elections))
	index := make(heartbeat.Batch, len(elections))
	names := make([]string, 0, len(elections))
	for i, e := range elections {
		if err := index.Add(e, i); err != nil {
			out[i].Err = fmt.Errorf("postgres: ParticipantsBatch: %w: %w", base.ErrInvalidConfig, err)
			continue
		}
		names = append(names, e)
	}
	if len(names) == 0 {
		return out, nil
	}
	rows, err := s.pool.Query(ctx, s.participantsBatchSQL, names)
	if err != nil {
		return nil, s.wrapErr(ctx, "postgres: ParticipantsBatch", err)
	}
	defer rows.Close()
	var (
		now time.Time
		key *string
		r   presenceRow
	)
	for rows.Next() {
		if err := rows.Scan(append([]any{&now, &key}, r.dest()...)...); err != nil {
			return nil, s.wrapErr(ctx, "postgres: ParticipantsBatch", err)
		}
		if key == nil {
			continue // no presence row (the LEFT JOIN's row of the clock alone)
		}
		election, _, _ := strings.Cut(*key, backend.PresenceSep)
		i, ok := index[election]
		if !ok {
			continue
		}
		if p, ok := r.presence(); ok {
			out[i].Presences = append(out[i].Presences, p)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, s.wrapErr(ctx, "postgres: ParticipantsBatch", err)
	}
	for _, i := range index {
		out[i].Now = now
	}
	return out, nil
}

// presenceRow holds the columns presenceCols reads.
type presenceRow struct {
	node        *string
	value       []byte
	ts, joined  *time.Time
	incarnation *int64
}

// dest returns the scan targets of presenceCols, in order.
func (r *presenceRow) dest() []any {
	return []any{&r.node, &r.value, &r.ts, &r.incarnation, &r.joined}
}

// presence decodes the row; false when there is none (the LEFT JOIN's row
// of the clock alone) or it is not a valid presence. A row of a version
// before incarnation and joined reads with Incarnation 0 (the column's
// default) and no Joined.
func (r *presenceRow) presence() (backend.Presence, bool) {
	if r.node == nil || r.ts == nil || r.incarnation == nil || *r.incarnation < 0 {
		return backend.Presence{}, false
	}
	var v presenceValue
	if json.Unmarshal(r.value, &v) != nil {
		return backend.Presence{}, false
	}
	p := backend.Presence{Node: *r.node, Value: v.Value, Priority: v.Priority, CanLead: v.CanLead, Token: v.Token,
		Incarnation: uint64(*r.incarnation), Timestamp: *r.ts}
	if r.joined != nil {
		p.Joined = *r.joined
	}
	return p, p.Validate() == nil
}
