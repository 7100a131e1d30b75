package basetest

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// presenceBatchStore runs the PresenceBatchStore rules when the harness
// opens Stores that batch presence calls.
func (s *suite) presenceBatchStore(t *testing.T) {
	rule(t, "PresentBatch writes each presence as Present would, stamped by the store's clock and never announced on the changefeed; a write that breaks the rules, or names an (election, node) a write before it names, fails alone; ParticipantsBatch reads each election as Participants would", func(t *testing.T) {
		ps := storeAs[backend.PresenceBatchStore](t, s)
		e1, e2, empty := Election(), Election(), Election()
		ch := storeSubscribe(t, ps)
		before := time.Now()
		errs, err := ps.PresentBatch(ctxFor(t), []backend.PresenceWrite{
			{Election: e1, Presence: backend.Presence{Node: "node-a", Value: []byte("a"), Priority: base.MaxPriority, CanLead: true, Token: heartbeat.MaxToken}},
			{Election: e1, Presence: backend.Presence{Node: "node-b", Priority: base.MinPriority}},
			{Election: e2, Presence: backend.Presence{Node: "node-a", CanLead: true, Token: 7}},
			{Election: e1, Presence: backend.Presence{Node: "node-a", CanLead: true, Token: 9}},                      // named before
			{Election: e2, Presence: backend.Presence{Node: "node-c", CanLead: true, Token: heartbeat.MaxToken + 1}}, // token too large
			{Election: "bad\x00name", Presence: backend.Presence{Node: "node-d", CanLead: true}},                     // no election name
		})
		if err != nil || len(errs) != 6 {
			t.Fatalf("PresentBatch = %v, %v; want six results", errs, err)
		}
		for i := range 3 {
			if errs[i] != nil {
				t.Fatalf("write %d: %v, want it written", i, errs[i])
			}
		}
		for i := 3; i < 6; i++ {
			if !errors.Is(errs[i], heartbeat.ErrInvalidRecord) {
				t.Fatalf("write %d: %v, want an error matching heartbeat.ErrInvalidRecord, and the write alone to fail", i, errs[i])
			}
		}
		want := map[string]string{e1: "node-a/100/true/a/9007199254740991 node-b/-100/false//0", e2: "node-a/0/true//7", empty: ""}
		one := func(election string) []backend.Presence {
			t.Helper()
			got, now, err := ps.Participants(ctxFor(t), election)
			if err != nil {
				t.Fatalf("Participants(%s): %v", election, err)
			}
			if d := describe(got); d != want[election] {
				t.Fatalf("Participants(%s) = %s, want %s", election, d, want[election])
			}
			for _, p := range got {
				if p.Timestamp.IsZero() || now.Before(p.Timestamp) {
					t.Fatalf("presence %s stamped %v, store time %v: want a store timestamp not after the store's time", p.Node, p.Timestamp, now)
				}
				if d := p.Timestamp.Sub(before); d < -time.Hour || d > time.Hour {
					t.Errorf("presence timestamp %v is more than an hour from this machine's %v", p.Timestamp, before)
				}
			}
			return got
		}
		first := one(e1)
		one(e2)
		res, err := ps.ParticipantsBatch(ctxFor(t), []string{e2, empty, e1, e2, "bad\x00name"})
		if err != nil || len(res) != 5 {
			t.Fatalf("ParticipantsBatch = %+v, %v; want five results", res, err)
		}
		for i, e := range []string{e2, empty, e1} {
			if res[i].Err != nil || describe(res[i].Presences) != want[e] || res[i].Now.IsZero() {
				t.Fatalf("ParticipantsBatch, election %d: %s at %v (%v); want %s, as Participants gives, and the store's time", i, describe(res[i].Presences), res[i].Now, res[i].Err, want[e])
			}
		}
		for i := 3; i < 5; i++ {
			if !errors.Is(res[i].Err, heartbeat.ErrInvalidRecord) {
				t.Fatalf("ParticipantsBatch, election %d (repeated, or no election name): %v, want an error matching heartbeat.ErrInvalidRecord", i, res[i].Err)
			}
		}

		// A refresh replaces the record and its token, stamped anew.
		if errs, err := ps.PresentBatch(ctxFor(t), []backend.PresenceWrite{
			{Election: e1, Presence: backend.Presence{Node: "node-a", Value: []byte("a"), Priority: base.MaxPriority, CanLead: true, Token: 5}},
		}); err != nil || len(errs) != 1 || errs[0] != nil {
			t.Fatalf("PresentBatch of a refresh = %v, %v", errs, err)
		}
		want[e1] = "node-a/100/true/a/5 node-b/-100/false//0"
		again := one(e1)
		// Not strictly later: two writes may read one clock value.
		if again[0].Timestamp.Before(first[0].Timestamp) {
			t.Fatalf("a refresh stamped %v, the write before it %v: want a store timestamp not earlier", again[0].Timestamp, first[0].Timestamp)
		}

		// Presence writes are not election records: the first notification
		// after them is the record written next.
		storeWrite(t, ps, heartbeat.Record{}, e1, "node-a", 1)
		n := nextStore(t, ch, "the election record", func(n backend.Notification) bool { return n.Type != backend.OtherChanged })
		if n.Type != backend.RecordChanged || n.Record.Election != e1 {
			t.Fatalf("the changefeed brought %v (election %q) first, want the election record of %s: a presence record of a batch was announced", n.Type, n.Election+n.Record.Election, e1)
		}
	})

	s.presenceBatchJoined(t)
}

// describe lists presences as "node/priority/canLead/value/token", sorted
// by node.
func describe(ps []backend.Presence) string {
	var out []string
	for _, p := range ps {
		out = append(out, fmt.Sprintf("%s/%d/%v/%s/%d", p.Node, p.Priority, p.CanLead, p.Value, p.Token))
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}
