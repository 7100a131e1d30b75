package base

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// ---- batched presence ----

// presenceWindowDivisor and maxPresenceWindow: a presence write, or a
// read of the participants, waits for those of other elections at most
// this fraction of the time its deadline leaves it, and at most the
// default window of a renewal: an eighth of PresenceInterval for a Feed's
// refresh (47 ms with the default timing), a small part of the call's
// own time and of the margin of the one-write handover (a successor's
// lease runs from when it sent the presence write the leader read, so a
// write that waits only shortens what is left of it, never lengthens
// it). A call without a deadline does not wait. So the presence calls of
// any number of elections cost at most about one batch of writes and one
// of reads per window.
const (
	presenceWindowDivisor = 8
	maxPresenceWindow     = heartbeat.DefaultHeartbeatInterval / batchWindowDivisor
)

// presenceBatch coalesces the presence calls of the elections of an
// Elections whose Store is a backend.PresenceBatchStore: the refreshes of
// a thousand participating elections, and the reads of the participants
// by their leaders, cost a few statements per presence interval, not one
// each. Calls wait in a gatherer; each waiter is answered by its batch or
// at its own deadline, whichever comes first.
type presenceBatch struct {
	e      *Elections
	store  backend.PresenceBatchStore
	writes *gatherer[*presenceReq]
	reads  *gatherer[*participantsReq]

	mu   sync.Mutex
	busy map[string]*keyFlights // PresenceKey -> the batches in flight that write it
}

// keyFlights counts the batches in flight that write one presence record;
// done is closed when the last one ends.
type keyFlights struct {
	n    int
	done chan struct{}
}

// presenceReq is one presence write waiting for a batch.
type presenceReq struct {
	ctx   context.Context // the caller's: a request whose ctx ended is not sent
	w     backend.PresenceWrite
	flush time.Time  // send by then
	reply chan error // room for one: the batch never blocks on it
}

func (r *presenceReq) flushAt() time.Time { return r.flush }

// participantsReq is one read of the participants waiting for a batch.
type participantsReq struct {
	ctx      context.Context
	election string
	flush    time.Time
	reply    chan backend.ParticipantsResult // room for one
}

func (r *participantsReq) flushAt() time.Time { return r.flush }

// startPresenceBatch batches the presence calls of e's elections when s
// can (backend.PresenceBatchStore) and batching is on.
func (e *Elections) startPresenceBatch(s backend.Store, opts ElectionsOptions) {
	ps, ok := s.(backend.PresenceBatchStore)
	if !ok || opts.NoBatch {
		return
	}
	pb := &presenceBatch{e: e, store: ps, busy: make(map[string]*keyFlights)}
	pb.writes = &gatherer[*presenceReq]{e: e, in: make(chan *presenceReq, e.maxBatch), send: pb.send,
		fail: func(r *presenceReq, err error) { r.reply <- err }}
	pb.reads = &gatherer[*participantsReq]{e: e, in: make(chan *participantsReq, e.maxBatch), send: pb.read,
		fail: func(r *participantsReq, err error) { r.reply <- backend.ParticipantsResult{Err: err} }}
	e.pres = pb
	e.wg.Add(2)
	go pb.writes.run()
	go pb.reads.run()
}

// presenceWindow returns how long a presence call bounded by ctx waits for
// those of other elections.
func presenceWindow(ctx context.Context) time.Duration {
	d, ok := ctx.Deadline()
	if !ok || ctx.Value(urgentKey{}) != nil {
		return 0
	}
	return min(max(0, time.Until(d)/presenceWindowDivisor), maxPresenceWindow)
}

// urgentKey marks the context of a presence call that a handover waits
// for (urgent): it joins a batch under way, but waits for no other.
type urgentKey struct{}

// urgent returns ctx marked so that its presence calls wait for no batch.
func urgent(ctx context.Context) context.Context { return context.WithValue(ctx, urgentKey{}, true) }

// present sends one presence write through the gatherer and waits for its
// result, at most until ctx ends.
func (pb *presenceBatch) present(ctx context.Context, election string, p backend.Presence) error {
	r := &presenceReq{ctx: ctx, w: backend.PresenceWrite{Election: election, Presence: p},
		flush: time.Now().Add(presenceWindow(ctx)), reply: make(chan error, 1)}
	return awaitBatch(ctx, pb.e, election, pb.writes, r, r.reply, func(err error) error { return err })
}

// participants sends one read of the participants through the gatherer
// and waits for its result, at most until ctx ends.
func (pb *presenceBatch) participants(ctx context.Context, election string) ([]backend.Presence, time.Time, error) {
	r := &participantsReq{ctx: ctx, election: election, flush: time.Now().Add(presenceWindow(ctx)),
		reply: make(chan backend.ParticipantsResult, 1)}
	res := awaitBatch(ctx, pb.e, election, pb.reads, r, r.reply, func(err error) backend.ParticipantsResult { return backend.ParticipantsResult{Err: err} })
	return res.Presences, res.Now, res.Err
}

// awaitBatch queues r on g and waits for its answer on reply, at most until ctx
// ends or the Elections closes; failed makes an answer of an error.
func awaitBatch[R coalesced, T any](ctx context.Context, e *Elections, election string, g *gatherer[R], r R, reply <-chan T, failed func(error) T) T {
	select {
	case g.in <- r:
	case <-ctx.Done():
		return failed(ctx.Err())
	case <-e.ctx.Done():
		return failed(fmt.Errorf("leaderfeed: election %q: %w", election, ErrClosed))
	}
	select {
	case res := <-reply:
		return res
	case <-ctx.Done():
		return failed(ctx.Err())
	case <-e.ctx.Done():
		// Closed: the request may or may not have been sent.
		return failed(fmt.Errorf("leaderfeed: election %q: %w", election, ErrClosed))
	}
}

// send writes one batch and answers its writes. A write whose caller has
// gone (its context ended) is not sent; of two writes of one presence
// record the later is sent, and both get its result. The batch's context
// lasts until the latest deadline of its writes: a write that must give
// up sooner is answered by its waiter at its own deadline, and a batch
// carrying a patient write does not end for an impatient one. The
// records it writes are busy until it ends (settle).
func (pb *presenceBatch) send(batch []*presenceReq) {
	var (
		writes  []backend.PresenceWrite
		owners  [][]*presenceReq
		keys    []string
		index   = make(map[string]int, len(batch))
		latest  time.Time
		bounded = true
	)
	pb.mu.Lock()
	for _, r := range batch {
		// Checked under pb.mu with the record marked busy: an Absent
		// that comes after this write's waiter gave up waits for it.
		if r.ctx.Err() != nil {
			continue
		}
		if d, ok := r.ctx.Deadline(); !ok {
			bounded = false
		} else if d.After(latest) {
			latest = d
		}
		key := backend.PresenceKey(r.w.Election, r.w.Presence.Node)
		if i, ok := index[key]; ok {
			writes[i] = r.w
			owners[i] = append(owners[i], r)
			continue
		}
		index[key] = len(writes)
		writes = append(writes, r.w)
		owners = append(owners, []*presenceReq{r})
		keys = append(keys, key)
		pb.hold(key)
	}
	pb.mu.Unlock()
	defer pb.release(keys)
	if len(writes) == 0 {
		return
	}
	ctx, cancel := context.WithCancel(pb.e.ctx)
	if bounded {
		ctx, cancel = context.WithDeadline(pb.e.ctx, latest)
	}
	defer cancel()
	var errs []error
	var err error
	if len(writes) == 1 {
		// A write alone is a Present, and ends with its own context too.
		stop := context.AfterFunc(owners[0][len(owners[0])-1].ctx, cancel)
		err = pb.store.Present(ctx, writes[0].Election, writes[0].Presence)
		stop()
		errs = []error{err}
	} else {
		errs, err = pb.store.PresentBatch(ctx, writes)
		if err == nil && len(errs) != len(writes) {
			err = fmt.Errorf("leaderfeed: store returned %d results for a batch of %d presence writes", len(errs), len(writes))
		}
	}
	if err != nil && pb.e.ctx.Err() != nil {
		err = fmt.Errorf("leaderfeed: elections: %w", ErrClosed)
	}
	for i, rs := range owners {
		res := err
		if err == nil {
			res = errs[i]
		}
		for _, r := range rs {
			r.reply <- res
		}
	}
}

// read reads the participants of one batch's elections and answers its
// reads; reads of one election share one (each gets its own copy). As
// send, it skips the reads whose caller has gone, and lasts until the
// latest deadline of the others.
func (pb *presenceBatch) read(batch []*participantsReq) {
	var (
		names   []string
		owners  [][]*participantsReq
		index   = make(map[string]int, len(batch))
		latest  time.Time
		bounded = true
	)
	for _, r := range batch {
		if r.ctx.Err() != nil {
			continue
		}
		if d, ok := r.ctx.Deadline(); !ok {
			bounded = false
		} else if d.After(latest) {
			latest = d
		}
		if i, ok := index[r.election]; ok {
			owners[i] = append(owners[i], r)
			continue
		}
		index[r.election] = len(names)
		names = append(names, r.election)
		owners = append(owners, []*participantsReq{r})
	}
	if len(names) == 0 {
		return
	}
	ctx, cancel := context.WithCancel(pb.e.ctx)
	if bounded {
		ctx, cancel = context.WithDeadline(pb.e.ctx, latest)
	}
	defer cancel()
	var results []backend.ParticipantsResult
	var err error
	if len(names) == 1 {
		// A read alone is a Participants, and ends with its own context too.
		stop := context.AfterFunc(owners[0][len(owners[0])-1].ctx, cancel)
		var res backend.ParticipantsResult
		res.Presences, res.Now, res.Err = pb.store.Participants(ctx, names[0])
		stop()
		results = []backend.ParticipantsResult{res}
	} else {
		results, err = pb.store.ParticipantsBatch(ctx, names)
		if err == nil && len(results) != len(names) {
			err = fmt.Errorf("leaderfeed: store returned %d results for a read of the participants of %d elections", len(results), len(names))
		}
	}
	if err != nil && pb.e.ctx.Err() != nil {
		err = fmt.Errorf("leaderfeed: elections: %w", ErrClosed)
	}
	for i, rs := range owners {
		res := backend.ParticipantsResult{Err: err}
		if err == nil {
			res = results[i]
		}
		for j, r := range rs {
			if j > 0 {
				res.Presences = slices.Clone(res.Presences)
			}
			r.reply <- res
		}
	}
}

// hold marks key busy for one more batch; pb.mu is held.
func (pb *presenceBatch) hold(key string) {
	k := pb.busy[key]
	if k == nil {
		k = &keyFlights{done: make(chan struct{})}
		pb.busy[key] = k
	}
	k.n++
}

// release ends a batch's hold of keys.
func (pb *presenceBatch) release(keys []string) {
	pb.mu.Lock()
	defer pb.mu.Unlock()
	for _, key := range keys {
		k := pb.busy[key]
		if k.n--; k.n == 0 {
			close(k.done)
			delete(pb.busy, key)
		}
	}
}

// settle waits until no batch in flight writes the presence record of
// node in election, or ctx ends: Absent deletes the record only after a
// write that its caller gave up on (Stop's leavePresence waits for the
// refresh in flight, at most its deadline), so that no refresh commits
// after the delete and lists a stopped node as live until it expires.
func (pb *presenceBatch) settle(ctx context.Context, election, node string) error {
	pb.mu.Lock()
	k := pb.busy[backend.PresenceKey(election, node)]
	pb.mu.Unlock()
	if k == nil {
		return nil
	}
	select {
	case <-k.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// coalesced is a request a gatherer batches: it is sent by flushAt.
type coalesced interface{ flushAt() time.Time }

// gatherer collects requests of one kind from the elections of an
// Elections and sends them in batches: a batch goes out once the
// earliest flush time of its requests has come, or it is full
// (MaxBatch). Each batch is sent on a goroutine of its own (flights), so
// that a batch in flight never holds up the next until maxInFlight are in
// flight; meanwhile the next keeps gathering. Each waiter gives up at its
// own deadline (awaitBatch), whatever its batch does.
type gatherer[R coalesced] struct {
	e    *Elections
	in   chan R             // room for MaxBatch; a waiter blocks on it only while a full batch waits for a flight
	send func(batch []R)    // answers every request of batch
	fail func(r R, e error) // answers r with e; never blocks
}

func (g *gatherer[R]) run() {
	e := g.e
	defer e.wg.Done()
	fl := newFlights(e)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	var pending []R
	for {
		select {
		case r := <-g.in:
			pending = append(pending, r)
		case <-e.ctx.Done():
			g.close(nil)
			return
		}
		flush := pending[0].flushAt()
	gather:
		for {
			var in <-chan R
			if len(pending) < e.maxBatch {
				in = g.in
			}
			var slot chan<- struct{}
			var timeout <-chan time.Time
			if d := time.Until(flush); d <= 0 || len(pending) >= e.maxBatch {
				slot = fl.slot()
			} else {
				timer.Reset(d)
				timeout = timer.C
			}
			select {
			case r := <-in:
				pending = append(pending, r)
				if r.flushAt().Before(flush) {
					flush = r.flushAt()
				}
			case <-timeout:
			case slot <- struct{}{}:
				break gather
			case <-e.ctx.Done():
				timer.Stop()
				g.close(pending)
				return
			}
			timer.Stop()
		}
		// What came while the batch waited for a flight goes with it.
	take:
		for len(pending) < e.maxBatch {
			select {
			case r := <-g.in:
				pending = append(pending, r)
			default:
				break take
			}
		}
		batch := slices.Clone(pending)
		clear(pending)
		pending = pending[:0]
		fl.start(func() { g.send(batch) })
	}
}

// close answers pending, and what waits in the inbox, with ErrClosed.
func (g *gatherer[R]) close(pending []R) {
	err := fmt.Errorf("leaderfeed: elections: %w", ErrClosed)
	for _, r := range pending {
		g.fail(r, err)
	}
	for {
		select {
		case r := <-g.in:
			g.fail(r, err)
		default:
			return
		}
	}
}
