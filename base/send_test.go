package base

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// okBatchStore answers every batch of writes at once, with no error (a
// store as fast as it gets, so that only send is measured).
type okBatchStore struct {
	backend.Store // nil: only the writes are called
	results       []backend.WriteResult
}

func (s *okBatchStore) Heartbeat(_ context.Context, _, next heartbeat.Record) (heartbeat.Record, error) {
	return next, nil
}

func (s *okBatchStore) HeartbeatBatch(_ context.Context, writes []backend.Write) ([]backend.WriteResult, error) {
	return s.results[:len(writes)], nil
}

// renewalBatch returns n renewals, whose answers go nowhere, with deadline
// (zero: none), of elections b0000, b0001...
func renewalBatch(n int, deadline time.Time) []*writeReq {
	batch := make([]*writeReq, n)
	for i := range batch {
		rec := heartbeat.Record{Election: fmt.Sprintf("b%04d", i), Leader: "node", Term: 1, Revision: 1, Lease: time.Second}
		batch[i] = newWriteReq(context.Background(), deadline, backend.Write{Expected: rec, Next: rec}, time.Millisecond, func(heartbeat.Record, error) {})
	}
	return batch
}

// BenchmarkElectionsSend measures send of one batch of 1,000 renewals,
// with a deadline, on a store that answers at once: the hot path of
// 10,000 elections renewing in step, less the store.
//
//	go test -run '^$' -bench ElectionsSend -benchmem ./base
func BenchmarkElectionsSend(b *testing.B) {
	const n = 1000
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := &okBatchStore{results: make([]backend.WriteResult, n)}
	e := &Elections{store: s, batch: s, ctx: ctx}
	batch := renewalBatch(n, time.Now().Add(time.Hour))
	b.ReportAllocs()
	for b.Loop() {
		for _, r := range batch {
			*r = writeReq{ctx: r.ctx, deadline: r.deadline, w: r.w, arrived: r.arrived, flush: r.flush, window: r.window, done: r.done}
		}
		e.send(batch)
	}
}

// parentCtx is a context that counts the children registered on it
// (through AfterFunc, as package context does for a parent of a type of
// its own) and not yet gone.
type parentCtx struct {
	done chan struct{}
	mu   sync.Mutex
	live int
}

func (p *parentCtx) Deadline() (time.Time, bool) { return time.Time{}, false }
func (p *parentCtx) Done() <-chan struct{}       { return p.done }
func (p *parentCtx) Err() error                  { return nil }
func (p *parentCtx) Value(any) any               { return nil }

func (p *parentCtx) AfterFunc(func()) func() bool {
	p.mu.Lock()
	p.live++
	p.mu.Unlock()
	var once sync.Once
	return func() bool {
		once.Do(func() {
			p.mu.Lock()
			p.live--
			p.mu.Unlock()
		})
		return true
	}
}

// send leaves no context of its batch registered on the Elections' own:
// each would be kept until Close, one a batch.
func TestElectionsSendLeavesNoContext(t *testing.T) {
	for _, tc := range []struct {
		name     string
		n        int
		deadline time.Time
	}{
		{"one write with a deadline", 1, time.Now().Add(time.Hour)},
		{"one write without", 1, time.Time{}},
		{"a batch with deadlines", 3, time.Now().Add(time.Hour)},
		{"a batch without", 3, time.Time{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &parentCtx{done: make(chan struct{})}
			s := &okBatchStore{results: make([]backend.WriteResult, tc.n)}
			e := &Elections{store: s, batch: s, ctx: p}
			e.send(renewalBatch(tc.n, tc.deadline))
			if p.live != 0 {
				t.Errorf("%d contexts of the sent batch still registered on the Elections' context", p.live)
			}
		})
	}
}

// Each write of a batch in flight is counted once, whether it is answered
// before, while or after send sets the batch's call up: the call ends
// when the last is answered, and only then.
func TestBatchCallCountsEachAnswerOnce(t *testing.T) {
	for range 1000 {
		batch := renewalBatch(4, time.Time{})
		var cancels atomic.Int64
		var wg sync.WaitGroup
		for _, r := range batch[:3] {
			wg.Go(func() { r.answer(backend.WriteResult{}) })
		}
		c := newBatchCall(batch, func() { cancels.Add(1) })
		wg.Wait()
		if n := cancels.Load(); n != 0 || c.left.Load() != 1 {
			t.Fatalf("3 of 4 writes answered: call cancelled %d times, %d left, want 0 and 1", n, c.left.Load())
		}
		batch[3].answer(backend.WriteResult{})
		batch[3].answer(backend.WriteResult{})
		if n := cancels.Load(); n != 1 || c.left.Load() != 0 {
			t.Fatalf("every write answered: call cancelled %d times, %d left, want 1 and 0", n, c.left.Load())
		}
	}
}
