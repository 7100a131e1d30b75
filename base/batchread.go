package base

import (
	"context"
	"fmt"
	"time"

	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// readReq is one Get waiting for a batch of reads.
type readReq struct {
	ctx      context.Context
	election string
	reply    chan backend.ReadResult // buffered: the reader never blocks on it
}

// read sends one Get through the reader and waits for its result.
func (e *Elections) read(ctx context.Context, election string) (heartbeat.Record, error) {
	r := &readReq{ctx: ctx, election: election, reply: make(chan backend.ReadResult, 1)}
	select {
	case e.reads <- r:
	case <-ctx.Done():
		return heartbeat.Record{}, ctx.Err()
	case <-e.ctx.Done():
		return heartbeat.Record{}, fmt.Errorf("leaderfeed: election %q: %w", election, ErrClosed)
	}
	select {
	case res := <-r.reply:
		return res.Record, res.Err
	case <-ctx.Done():
		return heartbeat.Record{}, ctx.Err()
	case <-e.ctx.Done():
		return heartbeat.Record{}, fmt.Errorf("leaderfeed: election %q: %w", election, ErrClosed)
	}
}

// reader serves the Gets of every election: a Get that finds a batch free
// to start (flights) is sent alone at once, and the Gets that arrive while
// maxInFlight reads are in flight go out together in one GetBatch (group
// commit): after a failure of the shared changefeed, thousands of elections
// read in a few statements instead of one each, a lone Get waits for
// nothing, and a read that hangs holds up no other.
func (e *Elections) reader() {
	defer e.wg.Done()
	fl := newFlights(e)
	var pending []*readReq
	for {
		select {
		case r := <-e.reads:
			pending = append(pending, r)
		case <-e.ctx.Done():
			e.failReads(nil)
			return
		}
		select {
		case fl.slot() <- struct{}{}:
		case <-e.ctx.Done():
			e.failReads(pending)
			return
		}
	gather:
		for len(pending) < e.maxBatch {
			select {
			case r := <-e.reads:
				pending = append(pending, r)
			default:
				break gather
			}
		}
		batch := pending[:0:0]
		for _, r := range pending {
			if err := r.ctx.Err(); err != nil {
				r.reply <- backend.ReadResult{Err: err}
			} else {
				batch = append(batch, r)
			}
		}
		clear(pending)
		pending = pending[:0]
		fl.start(func() { e.readBatch(batch) })
	}
}

// readBatch reads the records of one batch and hands out the results.
// Reads of one election (its Feed and its observers) share one read.
func (e *Elections) readBatch(batch []*readReq) {
	switch len(batch) {
	case 0:
		return
	case 1:
		r := batch[0]
		rec, err := e.store.Get(r.ctx, r.election)
		r.reply <- backend.ReadResult{Record: rec, Err: err}
		return
	}
	var deadline time.Time
	bounded := true
	index := make(map[string]int, len(batch))
	var names []string
	for _, r := range batch {
		if _, ok := index[r.election]; !ok {
			index[r.election] = len(names)
			names = append(names, r.election)
		}
		d, ok := r.ctx.Deadline()
		if !ok {
			bounded = false
		} else if d.After(deadline) {
			deadline = d
		}
	}
	ctx, cancel := context.WithCancel(e.ctx)
	if bounded {
		ctx, cancel = context.WithDeadline(e.ctx, deadline)
	}
	results, err := e.batchRead.GetBatch(ctx, names)
	cancel()
	if err == nil && len(results) != len(names) {
		err = fmt.Errorf("leaderfeed: store returned %d results for a read of %d elections", len(results), len(names))
	}
	for _, r := range batch {
		if err != nil {
			r.reply <- backend.ReadResult{Err: err}
		} else {
			r.reply <- results[index[r.election]]
		}
	}
}

func (e *Elections) failReads(pending []*readReq) {
	err := fmt.Errorf("leaderfeed: elections: %w", ErrClosed)
	for _, r := range pending {
		r.reply <- backend.ReadResult{Err: err}
	}
	for {
		select {
		case r := <-e.reads:
			r.reply <- backend.ReadResult{Err: err}
		default:
			return
		}
	}
}
