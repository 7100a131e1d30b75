package basetest

import (
	"errors"
	"sync"
	"testing"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// guardStore runs the GuardStore rules when the harness opens Stores
// with the guarded write.
func (s *suite) guardStore(t *testing.T) {
	rule(t, "HeartbeatGuarded writes as Heartbeat does while the guard's presence record (node and incarnation) exists; otherwise it writes nothing and fails with ErrNotPresent, or with a ConflictError when the record is not the expected one", func(t *testing.T) {
		gs := storeAs[backend.GuardStore](t, s)
		e := Election()
		ctx := ctxFor(t)
		ch := storeSubscribe(t, gs)
		r1 := storeWrite(t, gs, heartbeat.Record{}, e, "node-a", 1)
		if err := gs.Present(ctx, e, backend.Presence{Node: "node-b", CanLead: true, Token: 5, Incarnation: 50}); err != nil {
			t.Fatalf("Present: %v", err)
		}
		handover := heartbeat.Record{Election: e, Leader: "node-b", Term: 2, Lease: s.h.Timing.LeaseDuration, Handover: 5}
		for _, g := range []backend.Guard{{Node: "node-c", Incarnation: 50}, {Node: "node-b", Incarnation: 51}} {
			if _, err := gs.HeartbeatGuarded(ctx, r1, handover, g); !errors.Is(err, backend.ErrNotPresent) {
				t.Fatalf("HeartbeatGuarded guarded by %+v (no such presence) = %v, want an error matching ErrNotPresent", g, err)
			}
		}
		if cur, err := gs.Get(ctx, e); err != nil || !cur.SameWrite(r1) {
			t.Fatalf("Get after refused guarded writes = %v, %v; want %v unchanged", cur, err, r1)
		}
		r2, err := gs.HeartbeatGuarded(ctx, r1, handover, backend.Guard{Node: "node-b", Incarnation: 50})
		if err != nil || r2.Revision != r1.Revision+1 || r2.Leader != "node-b" || r2.Handover != 5 {
			t.Fatalf("HeartbeatGuarded with the guard present = %v, %v; want node-b's handover at revision %d", r2, err, r1.Revision+1)
		}
		nextStore(t, ch, "the guarded write on the changefeed", func(n backend.Notification) bool {
			return n.Type == backend.RecordChanged && n.Record.Election == e && n.Record.SameWrite(r2)
		})
		_, err = gs.HeartbeatGuarded(ctx, r1, handover, backend.Guard{Node: "node-b", Incarnation: 50})
		var conflict *backend.ConflictError
		if !errors.As(err, &conflict) || !conflict.Current.SameWrite(r2) {
			t.Fatalf("HeartbeatGuarded on a stale record = %v, want a ConflictError carrying %v", err, r2)
		}
		if err := gs.Absent(ctx, e, "node-b"); err != nil {
			t.Fatalf("Absent: %v", err)
		}
		_, err = gs.HeartbeatGuarded(ctx, r1, handover, backend.Guard{Node: "node-b", Incarnation: 50})
		if !errors.As(err, &conflict) {
			t.Fatalf("HeartbeatGuarded on a stale record with its guard gone = %v, want a ConflictError (a conflict is reported first)", err)
		}
		if _, err := gs.HeartbeatGuarded(ctx, heartbeat.Record{}, handover, backend.Guard{Node: "node-b", Incarnation: 50}); !errors.Is(err, base.ErrInvalidConfig) {
			t.Fatalf("HeartbeatGuarded of a first write (expected revision 0) = %v, want an error matching ErrInvalidConfig", err)
		}
	})
	rule(t, "A guarded write and an Absent of its guard at once: when the write succeeds, a Get made after the Absent returned sees it", func(t *testing.T) {
		gs := storeAs[backend.GuardStore](t, s)
		ctx := ctxFor(t)
		for round := range 20 {
			e := Election()
			r1 := storeWrite(t, gs, heartbeat.Record{}, e, "node-a", 1)
			if err := gs.Present(ctx, e, backend.Presence{Node: "node-b", CanLead: true, Token: 5, Incarnation: 50}); err != nil {
				t.Fatalf("Present: %v", err)
			}
			var wg sync.WaitGroup
			var written heartbeat.Record
			var werr, aerr, gerr error
			var seen heartbeat.Record
			wg.Add(2)
			go func() {
				defer wg.Done()
				written, werr = gs.HeartbeatGuarded(ctx, r1, heartbeat.Record{Election: e, Leader: "node-b", Term: 2, Lease: s.h.Timing.LeaseDuration, Handover: 5},
					backend.Guard{Node: "node-b", Incarnation: 50})
			}()
			go func() {
				defer wg.Done()
				if aerr = gs.Absent(ctx, e, "node-b"); aerr == nil {
					seen, gerr = gs.Get(ctx, e)
				}
			}()
			wg.Wait()
			switch {
			case aerr != nil || gerr != nil:
				t.Fatalf("round %d: Absent: %v; Get: %v", round, aerr, gerr)
			case werr != nil && !errors.Is(werr, backend.ErrNotPresent):
				t.Fatalf("round %d: HeartbeatGuarded: %v, want success or ErrNotPresent", round, werr)
			case werr == nil && seen.Revision < written.Revision:
				t.Fatalf("round %d: the guarded write committed (%v) but a Get after the Absent of its guard saw %v", round, written, seen)
			}
		}
	})
}
