package faulty_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"

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

// SubscribeFunc forwards the wrapped Election's SubscribeFunc, or reads
// its channel feed for deliver when it has none; either way the Subscribe
// faults hit it, BreakFeed ends it with Failed as the last delivery,
// nothing is delivered once cancel returned, Partition refuses it, and no
// goroutine is left (synctest).
func TestSubscribeFunc(t *testing.T) {
	for _, mode := range []string{"forwarded", "channel"} {
		t.Run(mode, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx := context.Background()
				db := memory.NewDB()
				inner, err := db.Election("e")
				if err != nil {
					t.Fatal(err)
				}
				if mode == "channel" {
					inner = channelOnly{inner}
				}
				fb := faulty.Wrap(inner)
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
