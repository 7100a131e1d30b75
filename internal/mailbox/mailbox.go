// Package mailbox is the one queue type of leaderfeed: a FIFO of values
// handed to one taker function, on a goroutine that runs only while the
// box holds something (Box), or to a reader's channel (Pipe).
package mailbox

import "sync"

// Box queues values for take, in the order they were put. Put never blocks:
// a box that holds values has one goroutine (started by start, on demand)
// that hands them to take one at a time, in order, and ends once the box is
// empty, so an idle box holds no goroutine. A Box is bounded by its
// senders: each kind of value either comes from a source that has at most
// a few in flight, or is coalesced (Replace), or its sender checks Len
// before putting. Close hands back what is queued; later puts are refused.
type Box[T any] struct {
	take       func(T)
	begin, end func()

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
	if begin == nil {
		begin = func() {}
	}
	if end == nil {
		end = func() {}
	}
	return &Box[T]{take: take, begin: begin, end: end}
}

// Put queues v. It reports false, and drops v, if the Box is closed.
func (b *Box[T]) Put(v T) bool {
	_, ok := b.Replace(v, nil)
	return ok
}

// PutHere is Put for a goroutine that has nothing else to do (a timer's
// function, a call whose result v is): if no goroutine takes from the Box,
// the caller takes, until the Box is empty, before PutHere returns.
func (b *Box[T]) PutHere(v T) bool {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return false
	}
	b.queue = append(b.queue, v)
	if b.running {
		b.mu.Unlock()
		return true
	}
	b.running = true
	b.begin()
	b.mu.Unlock()
	b.run()
	b.end()
	return true
}

// Replace drops the queued values for which stale reports true, then queues
// v: the coalescing put of a queue that keeps only the latest of a kind. It
// returns how many it dropped, and false if the Box is closed (v is dropped
// too). stale is called with the Box's lock held.
func (b *Box[T]) Replace(v T, stale func(T) bool) (dropped int, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, false
	}
	if stale != nil {
		kept := b.queue[:b.head]
		for _, q := range b.queue[b.head:] {
			if stale(q) {
				dropped++
			} else {
				kept = append(kept, q)
			}
		}
		clear(b.queue[len(kept):])
		b.queue = kept
	}
	b.queue = append(b.queue, v)
	if !b.running {
		b.running = true
		b.begin()
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
	var zero T
	for {
		b.mu.Lock()
		if b.head == len(b.queue) {
			b.running = false
			if cap(b.queue) > maxKept {
				b.queue = nil
			} else {
				b.queue = b.queue[:0]
			}
			b.head = 0
			b.mu.Unlock()
			return
		}
		v := b.queue[b.head]
		b.queue[b.head] = zero
		b.head++
		b.mu.Unlock()
		b.take(v)
	}
}

// maxKept is the room an idle Box keeps for the next values; a larger
// queue is freed once it is empty.
const maxKept = 8
