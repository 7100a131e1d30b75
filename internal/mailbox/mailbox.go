// Package mailbox is the one queue type of leaderfeed: a FIFO of values
// handed to one taker function, on a goroutine that runs only while the
// box holds something (Box), or to a reader's channel (Pipe).
package mailbox

import (
	"runtime"
	"sync"
	"time"
)

// Box queues values for take, in the order they were put. Put never blocks:
// a box that holds values has one goroutine (started on demand, or one of
// its Runner's) that hands them to take one at a time, in order, and ends
// (or serves another Box) once the box is empty, so an idle box holds no
// goroutine. A Box is bounded by its senders: each kind of value either
// comes from a source that has at most a few in flight, or is coalesced
// (Replace), or its sender checks Len before putting. Close hands back
// what is queued; later puts are refused.
type Box[T any] struct {
	take       func(T)
	begin, end func()
	runner     *Runner // nil: a goroutine of its own per run
	keep       int     // room an idle Box keeps (maxKept, or a Pipe's)

	mu      sync.Mutex
	queue   []T
	head    int // queue[head:] waits
	running bool
	closed  bool
}

// New returns an empty Box handing its values to take. begin, if not nil,
// is called when a goroutine starts taking (with the Box's lock held, so
// that a closed Box starts none: it must not call the Box), and end when
// it has stopped: an owner counts its goroutines with them.
func New[T any](take func(T), begin, end func()) *Box[T] {
	return NewOn(nil, take, begin, end)
}

// NewOn is New for a Box whose values are taken on r's goroutines (see
// Runner); a nil r is New's goroutine of its own.
func NewOn[T any](r *Runner, take func(T), begin, end func()) *Box[T] {
	if begin == nil {
		begin = func() {}
	}
	if end == nil {
		end = func() {}
	}
	return &Box[T]{take: take, begin: begin, end: end, runner: r, keep: maxKept}
}

// Put queues v. It reports false, and drops v, if the Box is closed.
func (b *Box[T]) Put(v T) bool {
	_, ok := b.Replace(v, nil)
	return ok
}

// PutHere is Put for a goroutine that has nothing else to do (a timer's
// function, a call whose result v is): if no goroutine takes from the Box,
// the caller takes, until the Box is empty, before PutHere returns. On a
// Runner it is PutUrgent instead: the Runner's goroutines take, and v is
// what a goroutine of its own waited for.
func (b *Box[T]) PutHere(v T) bool {
	if b.runner != nil {
		return b.PutUrgent(v)
	}
	here, ok := b.runHere(v)
	if here {
		b.take(v)
		b.run()
		b.end()
	}
	return ok
}

// TakeHere is Put for a caller that waits for v's outcome anyway (a
// request whose reply it awaits): if no goroutine takes from the Box, the
// caller takes v itself, and only v: values put meanwhile are taken on a
// goroutine started for them, as by Put. On a Runner the caller counts as
// one of its goroutines while it takes, and takes only when one more may
// run (else it is Put); values put meanwhile wait for the Runner.
func (b *Box[T]) TakeHere(v T) bool {
	r := b.runner
	if r != nil && !r.enter() {
		return b.Put(v)
	}
	here, ok := b.runHere(v)
	if !here {
		if r != nil {
			r.leave()
		}
		return ok
	}
	b.take(v)
	b.mu.Lock()
	if b.head == len(b.queue) {
		b.idleLocked()
		b.mu.Unlock()
		b.end()
		if r != nil {
			r.leave()
		}
		return true
	}
	b.mu.Unlock()
	if r != nil {
		r.schedule(b, false)
		r.leave()
		return true
	}
	go func() {
		b.run()
		b.end()
	}()
	return true
}

// runHere reports whether the caller is to take v itself: when no
// goroutine takes from the Box, it marks the Box running for the caller;
// else it queues v (ok false: the Box is closed, v is dropped).
func (b *Box[T]) runHere(v T) (here, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.closed:
		return false, false
	case b.running:
		b.queue = append(b.queue, v)
		return false, true
	}
	b.running = true
	b.begin()
	return true, true
}

// Replace drops the queued values q for which stale(q, v) reports true,
// then queues v: the coalescing put of a queue that keeps only the latest
// of a kind. It returns how many it dropped, and false if the Box is closed
// (v is dropped too). stale is called with the Box's lock held.
func (b *Box[T]) Replace(v T, stale func(q, v T) bool) (dropped int, ok bool) {
	return b.put(v, stale, false)
}

// PutUrgent is Put for a value that bounds a deadline (the reply of a
// store call): if the Box is on a Runner and waits for a turn because of
// v, it gets one before the Boxes queued by Put.
func (b *Box[T]) PutUrgent(v T) bool {
	_, ok := b.put(v, nil, true)
	return ok
}

func (b *Box[T]) put(v T, stale func(q, v T) bool, urgent bool) (dropped int, ok bool) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return 0, false
	}
	if stale != nil {
		kept := b.queue[:b.head]
		for _, q := range b.queue[b.head:] {
			if stale(q, v) {
				dropped++
			} else {
				kept = append(kept, q)
			}
		}
		clear(b.queue[len(kept):])
		b.queue = kept
	}
	b.queue = append(b.queue, v)
	if b.running {
		b.mu.Unlock()
		return dropped, true
	}
	b.running = true
	b.begin()
	b.mu.Unlock()
	if b.runner != nil {
		b.runner.schedule(b, urgent)
	} else {
		go func() {
			b.run()
			b.end()
		}()
	}
	return dropped, true
}

// Len returns how many values wait.
func (b *Box[T]) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue) - b.head
}

// Close refuses later puts and returns the values still queued, which
// take will not get. It may be called by take (the goroutine then ends
// after take returns). It is idempotent.
func (b *Box[T]) Close() []T {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	left := b.queue[b.head:]
	b.queue, b.head = nil, 0
	return left
}

// run hands the queue to take until it is empty.
func (b *Box[T]) run() {
	for {
		v, ok := b.next()
		if !ok {
			return
		}
		b.take(v)
	}
}

// turn is run for a Runner's goroutine: it hands up to turnValues values
// to take, then queues the Box on the Runner again if more wait, so that
// one busy Box does not hold up the others.
func (b *Box[T]) turn() {
	for range turnValues {
		v, ok := b.next()
		if !ok {
			b.end()
			return
		}
		b.take(v)
	}
	b.mu.Lock()
	if b.head == len(b.queue) {
		b.idleLocked()
		b.mu.Unlock()
		b.end()
		return
	}
	b.mu.Unlock()
	b.runner.schedule(b, false)
}

// turnValues is how many values a Runner's goroutine takes from one Box
// before it serves the next.
const turnValues = 32

// next returns the next value for take, or false, and the Box stops
// running, when none waits.
func (b *Box[T]) next() (T, bool) {
	var zero T
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.head == len(b.queue) {
		b.idleLocked()
		return zero, false
	}
	v := b.queue[b.head]
	b.queue[b.head] = zero
	b.head++
	return v, true
}

// idleLocked marks the Box, whose queue is empty, as not running.
func (b *Box[T]) idleLocked() {
	b.running = false
	if cap(b.queue) > b.keep {
		b.queue = nil
	} else {
		b.queue = b.queue[:0]
	}
	b.head = 0
}

// maxKept is the room an idle Box keeps for the next values; a larger
// queue is freed once it is empty. An engine's Box mostly holds one or
// two, and there is one per election.
const maxKept = 2

// maxKeptPipe is the room an idle Pipe keeps. A Pipe that serves a
// changefeed gets a burst per batch written (a notification per record),
// and a few Pipes keeping their largest burst's room, up to this, cost
// less than growing it again every time.
const maxKeptPipe = 1 << 14

// Runner takes the values of many Boxes (NewOn) on a few goroutines. A Box
// that gets a value while idle queues itself on the Runner instead of
// starting a goroutine; each of the Runner's goroutines serves the queued
// Boxes in turn, and ends when it finds none waiting, so an idle Runner
// holds no goroutine. At most max run at once, so they serve many Boxes in
// a row on stacks already grown, where a goroutine per run would start
// with a small stack and grow it on every take.
//
// Boxes queued by PutUrgent are served first: a burst of Boxes with
// nothing urgent (a renewal due for each of thousands of elections) does
// not hold up the replies that extend their leases.
//
// Each Box keeps one taker at a time and its order. A take that blocks
// holds up one goroutine, not the Boxes queued behind it: when no turn has
// started for stallAfter while Boxes wait, the Runner starts one more.
// A Runner's goroutines and timer belong to the goroutine that made it,
// for testing/synctest: never share one between bubbles.
type Runner struct {
	max int

	mu       sync.Mutex
	urgent   fifo   // Boxes that got a value by PutUrgent: served first
	ready    fifo   // the others
	workers  int    // goroutines serving the queues
	turns    uint64 // turns started so far
	watching bool   // watch is armed
	seen     uint64 // turns when watch was armed
	watch    *time.Timer
	idle     chan struct{} // closed when workers drops to 0 (Wait)
	started  uint64        // goroutines started so far
}

// runnable is a Box, whatever its value type.
type runnable interface{ turn() }

// stallAfter is how long Boxes wait with no turn started before a Runner
// starts another goroutine: a take that blocks (against its contract)
// costs the others this, not liveness.
const stallAfter = 10 * time.Millisecond

// NewRunner returns a Runner with at most n goroutines serving Boxes at
// once (more only while takes block); n < 1 means 1.
func NewRunner(n int) *Runner {
	return &Runner{max: max(1, n)}
}

// schedule queues b, which runs (b.running is set), for a turn.
func (r *Runner) schedule(b runnable, urgent bool) {
	r.mu.Lock()
	if urgent {
		r.urgent.push(b)
	} else {
		r.ready.push(b)
	}
	start := r.workers < r.max
	if start {
		r.workers++
		r.started++
	} else if !r.watching {
		r.watching, r.seen = true, r.turns
		if r.watch == nil {
			r.watch = time.AfterFunc(stallAfter, r.check)
		} else {
			r.watch.Reset(stallAfter)
		}
	}
	r.mu.Unlock()
	if start {
		go r.work()
	}
}

// Hand runs f, which puts values in Boxes of r, and then, if a goroutine
// of r started meanwhile, yields the caller's thread (runtime.Gosched):
// for a goroutine that hands values on and has nothing else to do until
// the next (a changefeed's, between two notifications). The goroutine
// started for a take then runs at once, where it would wait until the
// caller blocks or another thread wakes to steal it, tens of microseconds
// on an idle process. The caller does not take: a take that blocks holds
// up one of r's goroutines, never the caller.
func (r *Runner) Hand(f func()) {
	r.mu.Lock()
	before := r.started
	r.mu.Unlock()
	f()
	r.mu.Lock()
	started := r.started != before
	r.mu.Unlock()
	if started {
		yield()
	}
}

// yield is runtime.Gosched; tests count the calls.
var yield = runtime.Gosched

// work serves queued Boxes until none waits.
func (r *Runner) work() {
	for yielded := false; ; {
		r.mu.Lock()
		b := r.urgent.pop()
		if b == nil {
			b = r.ready.pop()
		}
		if b == nil {
			if !yielded {
				// Yield once before ending: on a busy process the next
				// Box is often about to be queued (a timer fired, a
				// reply came in), and a new goroutine would grow its
				// stack again.
				r.mu.Unlock()
				yielded = true
				runtime.Gosched()
				continue
			}
			r.workers--
			if r.workers == 0 && r.idle != nil {
				close(r.idle)
				r.idle = nil
			}
			r.mu.Unlock()
			return
		}
		yielded = false
		r.turns++
		r.mu.Unlock()
		b.turn()
	}
}

// enter counts the caller as one of r's goroutines, if one more may run.
func (r *Runner) enter() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.workers >= r.max {
		return false
	}
	r.workers++
	return true
}

// leave ends what enter began; a Box that waits meanwhile, for lack of a
// goroutine, gets one.
func (r *Runner) leave() {
	r.mu.Lock()
	start := r.urgent.len()+r.ready.len() > 0
	if !start {
		r.workers--
		if r.workers == 0 && r.idle != nil {
			close(r.idle)
			r.idle = nil
		}
	}
	r.mu.Unlock()
	if start {
		go r.work() // in the caller's place, counted as it was
	}
}

// Workers returns how many goroutines serve r now.
func (r *Runner) Workers() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.workers
}

// Wait returns once none of r's goroutines runs, and stops its timer if
// no Box waits: the owner of r calls it once its Boxes are closed or idle,
// so that it leaves no goroutine behind. It must not be called from a take.
func (r *Runner) Wait() {
	r.mu.Lock()
	if r.watching && r.urgent.len() == 0 && r.ready.len() == 0 {
		r.watch.Stop()
		r.watching = false
	}
	if r.workers == 0 {
		r.mu.Unlock()
		return
	}
	if r.idle == nil {
		r.idle = make(chan struct{})
	}
	idle := r.idle
	r.mu.Unlock()
	<-idle
}

// check runs stallAfter after the watch was armed: if Boxes wait and no
// turn started since, every goroutine is blocked in a take, so it starts
// another. It watches on while Boxes wait.
func (r *Runner) check() {
	r.mu.Lock()
	if r.urgent.len() == 0 && r.ready.len() == 0 {
		r.watching = false
		r.mu.Unlock()
		return
	}
	start := r.turns == r.seen
	if start {
		r.workers++
	}
	r.seen = r.turns
	r.watch.Reset(stallAfter)
	r.mu.Unlock()
	if start {
		go r.work()
	}
}

// fifo is a queue of Boxes.
type fifo struct {
	items []runnable // items[head:] wait
	head  int
}

func (q *fifo) len() int { return len(q.items) - q.head }

func (q *fifo) push(b runnable) {
	if len(q.items) == cap(q.items) && q.head >= len(q.items)/2 {
		// Reuse the room of those taken, when it is at least half.
		n := copy(q.items, q.items[q.head:])
		clear(q.items[n:])
		q.items, q.head = q.items[:n], 0
	}
	q.items = append(q.items, b)
}

// pop returns the first Box, or nil.
func (q *fifo) pop() runnable {
	if q.head == len(q.items) {
		if cap(q.items) > maxKeptReady {
			q.items = nil
		} else {
			q.items = q.items[:0]
		}
		q.head = 0
		return nil
	}
	b := q.items[q.head]
	q.items[q.head] = nil
	q.head++
	return b
}

// maxKeptReady is the room an idle Runner keeps for queued Boxes; a larger
// queue is freed once it is empty.
const maxKeptReady = 1024
