package faulty_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/base/faulty"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/memory"
)

// channelOnly hides the FuncSubscriber of the Election it wraps.
type channelOnly struct{ backend.Election }

// recorder is a deliver function's log.
type recorder struct {
	mu  sync.Mutex
	got []backend.Notification
}

func (r *recorder) deliver(n backend.Notification) {
	r.mu.Lock()
	r.got = append(r.got, n)
	r.mu.Unlock()
}

func (r *recorder) types() []backend.NotificationType {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ts []backend.NotificationType
	for _, n := range r.got {
		ts = append(ts, n.Type)
	}
	return ts
}

// wrapper is what Backend and Store have in common here.
type wrapper interface {
	Heartbeat(ctx context.Context, expected, next heartbeat.Record) (heartbeat.Record, error)
	SubscribeFunc(ctx context.Context, deliver func(backend.Notification)) (func(), error)
	Inject(faulty.Fault)
	BreakFeed(error)
	Partition()
	Heal()
	Close() error
}

// SubscribeFunc of a Backend or a Store forwards the wrapped one's
// SubscribeFunc, or reads its channel feed for deliver when it has none;
// either way the Subscribe faults hit it, BreakFeed ends it with Failed as
// the last delivery, nothing is delivered once cancel returned, Partition
// refuses it, and no goroutine is left (synctest).
func TestSubscribeFunc(t *testing.T) {
	for _, tc := range []struct {
		name string
		wrap func(db *memory.DB) wrapper
	}{
		{"election forwarded", func(db *memory.DB) wrapper { e, _ := db.Election("e"); return faulty.Wrap(e) }},
		{"election channel", func(db *memory.DB) wrapper { e, _ := db.Election("e"); return faulty.Wrap(channelOnly{e}) }},
		// memory.Conn has only a channel feed; a Store around a Store
		// forwards the inner one's SubscribeFunc.
		{"store channel", func(db *memory.DB) wrapper { return faulty.WrapStore(db.Conn()) }},
		{"store forwarded", func(db *memory.DB) wrapper { return faulty.WrapStore(faulty.WrapStore(db.Conn())) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx := context.Background()
				fb := tc.wrap(memory.NewDB())
				write := func(expected heartbeat.Record, term uint64) heartbeat.Record {
					t.Helper()
					r, err := fb.Heartbeat(ctx, expected, heartbeat.Record{Election: "e", Leader: "a", Term: term})
					if err != nil {
						t.Fatalf("Heartbeat: %v", err)
					}
					return r
				}

				boom := errors.New("no LISTEN privilege")
				fb.Inject(faulty.Fault{Method: faulty.MethodSubscribe, Nth: 1, Err: boom})
				if _, err := fb.SubscribeFunc(ctx, func(backend.Notification) {}); !errors.Is(err, boom) {
					t.Fatalf("SubscribeFunc with a fault: %v, want it", err)
				}

				var r recorder
				cancel, err := fb.SubscribeFunc(ctx, r.deliver)
				if err != nil {
					t.Fatal(err)
				}
				rec := write(heartbeat.Record{}, 1)
				synctest.Wait()
				if ts := r.types(); len(ts) != 1 || ts[0] != backend.RecordChanged {
					t.Fatalf("after a write: %v, want one RecordChanged", ts)
				}
				fb.BreakFeed(nil)
				rec = write(rec, 2)
				synctest.Wait()
				ts := r.types()
				if len(ts) != 2 || ts[1] != backend.Failed || !errors.Is(r.got[1].Err, faulty.ErrInjected) {
					t.Fatalf("after BreakFeed and a write: %v, want RecordChanged then Failed (ErrInjected) last", r.got)
				}
				cancel()

				var r2 recorder
				cancel2, err := fb.SubscribeFunc(ctx, r2.deliver)
				if err != nil {
					t.Fatal(err)
				}
				cancel2()
				write(rec, 3)
				synctest.Wait()
				if ts := r2.types(); len(ts) != 0 {
					t.Fatalf("deliveries after cancel: %v", ts)
				}

				fb.Partition()
				if _, err := fb.SubscribeFunc(ctx, func(backend.Notification) {}); !errors.Is(err, faulty.ErrInjected) {
					t.Fatalf("SubscribeFunc while partitioned: %v, want ErrInjected", err)
				}
				fb.Heal()
				if err := fb.Close(); err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}

// A Late fault makes a call its caller gave up on go through once its
// Delay has passed: the caller gets its context's error, the store the
// call.
func TestLate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, _ := memory.NewDB().Election("e")
		fb := faulty.Wrap(b)
		fb.Inject(faulty.Fault{Method: faulty.MethodPresent, Nth: 1, Delay: 30 * time.Millisecond, Late: true})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		if err := fb.Present(ctx, backend.Presence{Node: "n", CanLead: true}); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Present: %v, want the caller's context's error", err)
		}
		ps, _, err := fb.Participants(context.Background())
		if err != nil || len(ps) != 1 || ps[0].Node != "n" {
			t.Fatalf("Participants = %v, %v; want the late write in the store", ps, err)
		}
	})
}

// presenceOnly hides the presence batch capability of the store it wraps.
type presenceOnly struct{ backend.PresenceStore }

// A Store's PresentBatch forwards the wrapped store's, or makes it of
// single Presents when it has none; a fault without Election fails the
// whole batch (with After, once it was written), one with Election the
// writes of that election alone. ParticipantsBatch forwards or falls
// back the same way, and a fault fails it as a whole.
func TestStorePresenceBatch(t *testing.T) {
	for _, tc := range []struct {
		name string
		wrap func(db *memory.DB) *faulty.Store
	}{
		{"forwarded", func(db *memory.DB) *faulty.Store { return faulty.WrapStore(db.Conn()) }},
		{"single calls", func(db *memory.DB) *faulty.Store { return faulty.WrapStore(presenceOnly{db.Conn()}) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			db := memory.NewDB()
			fs := tc.wrap(db)
			nodes := func(election string) []string {
				t.Helper()
				ps, _, err := db.Conn().Participants(ctx, election)
				if err != nil {
					t.Fatal(err)
				}
				var out []string
				for _, p := range ps {
					out = append(out, p.Node)
				}
				slices.Sort(out)
				return out
			}
			batch := func(node string) []backend.PresenceWrite {
				return []backend.PresenceWrite{
					{Election: "e1", Presence: backend.Presence{Node: node, CanLead: true}},
					{Election: "e2", Presence: backend.Presence{Node: node, CanLead: true}},
				}
			}
			if errs, err := fs.PresentBatch(ctx, batch("a")); err != nil || len(errs) != 2 || errs[0] != nil || errs[1] != nil {
				t.Fatalf("PresentBatch = %v, %v; want two writes", errs, err)
			}
			fs.Inject(faulty.Fault{Method: faulty.MethodPresentBatch, Nth: 1})
			if _, err := fs.PresentBatch(ctx, batch("b")); !errors.Is(err, faulty.ErrInjected) {
				t.Fatalf("PresentBatch with a fault: %v, want ErrInjected", err)
			}
			boom := errors.New("boom")
			fs.Inject(faulty.Fault{Method: faulty.MethodPresentBatch, Nth: 1, Election: "e2", Err: boom})
			if errs, err := fs.PresentBatch(ctx, batch("c")); err != nil || errs[0] != nil || !errors.Is(errs[1], boom) {
				t.Fatalf("PresentBatch with a fault of e2: %v, %v; want e2's write alone to fail", errs, err)
			}
			fs.Inject(faulty.Fault{Method: faulty.MethodPresentBatch, Nth: 1, Election: "e2", Err: boom, After: true})
			if errs, err := fs.PresentBatch(ctx, batch("d")); err != nil || errs[0] != nil || !errors.Is(errs[1], boom) {
				t.Fatalf("PresentBatch with a lost reply of e2: %v, %v; want e2's write alone to fail", errs, err)
			}
			if got1, got2 := nodes("e1"), nodes("e2"); !slices.Equal(got1, []string{"a", "c", "d"}) || !slices.Equal(got2, []string{"a", "d"}) {
				t.Fatalf("presence records %v in e1 and %v in e2, want a, c, d and a, d", got1, got2)
			}
			if got := fs.Calls(faulty.MethodPresentBatch); got != 4 {
				t.Fatalf("%d PresentBatch calls counted, want 4", got)
			}

			res, err := fs.ParticipantsBatch(ctx, []string{"e2", "none"})
			if err != nil || len(res) != 2 || len(res[0].Presences) != 2 || res[0].Now.IsZero() || len(res[1].Presences) != 0 || res[1].Err != nil {
				t.Fatalf("ParticipantsBatch = %+v, %v; want e2's two participants and none of the other", res, err)
			}
			fs.Inject(faulty.Fault{Method: faulty.MethodParticipantsBatch, Nth: 1})
			if _, err := fs.ParticipantsBatch(ctx, []string{"e1"}); !errors.Is(err, faulty.ErrInjected) {
				t.Fatalf("ParticipantsBatch with a fault: %v, want ErrInjected", err)
			}
		})
	}
}
