package mailbox

import (
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

func TestOrderAndIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var got []int
		var wg sync.WaitGroup
		b := New(func(v int) { got = append(got, v); wg.Done() }, nil, nil)
		for i := range 100 {
			wg.Add(1)
			if !b.Put(i) {
				t.Fatal("Put refused on an open box")
			}
		}
		wg.Wait()
		synctest.Wait() // the taker ended: no goroutine is left (synctest checks)
		for i, v := range got {
			if v != i {
				t.Fatalf("got %v, want 0..99 in order", got)
			}
		}
	})
}

func TestReplaceAndClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		block := make(chan struct{})
		var got []int
		b := New(func(v int) {
			if v == 0 {
				<-block
			}
			got = append(got, v)
		}, nil, nil)
		b.Put(0) // taken, blocks the taker
		synctest.Wait()
		b.Put(1)
		b.Put(2)
		b.Put(3)
		if n, ok := b.Replace(4, func(q, _ int) bool { return q%2 == 1 }); n != 2 || !ok {
			t.Fatalf("Replace dropped %d (ok %v), want 2", n, ok)
		}
		if n := b.Len(); n != 2 {
			t.Fatalf("Len %d, want 2", n)
		}
		close(block)
		synctest.Wait()
		if want := []int{0, 2, 4}; len(got) != 3 || got[0] != 0 || got[1] != 2 || got[2] != 4 {
			t.Fatalf("got %v, want %v", got, want)
		}
		b.Close()
		if b.Put(5) {
			t.Fatal("Put accepted on a closed box")
		}
	})
}

func TestRunnerOrderAndIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := NewRunner(2)
		const boxes, values = 50, 100
		got := make([][]int, boxes)
		var running, maxRunning int
		var mu sync.Mutex
		var wg sync.WaitGroup
		var bs []*Box[int]
		for i := range boxes {
			bs = append(bs, NewOn(r, func(v int) {
				mu.Lock()
				running++
				maxRunning = max(maxRunning, running)
				got[i] = append(got[i], v)
				running--
				mu.Unlock()
				wg.Done()
			}, nil, nil))
		}
		for v := range values {
			for i, b := range bs {
				wg.Add(1)
				if i%2 == 0 {
					b.Put(v)
				} else {
					b.PutHere(v)
				}
			}
		}
		wg.Wait()
		synctest.Wait() // the Runner's goroutines ended (synctest checks)
		for i, g := range got {
			if len(g) != values {
				t.Fatalf("box %d took %d values, want %d", i, len(g), values)
			}
			for j, v := range g {
				if v != j {
					t.Fatalf("box %d took %v, want 0..%d in order", i, g, values-1)
				}
			}
		}
		if maxRunning > 2 {
			t.Errorf("%d takes ran at once on a Runner of 2", maxRunning)
		}
	})
}

// A take that blocks holds up its Box only: the Runner starts another
// goroutine for the Boxes queued behind it.
func TestRunnerBlockedTake(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := NewRunner(1)
		block := make(chan struct{})
		blocked := NewOn(r, func(int) { <-block }, nil, nil)
		var mu sync.Mutex // the timer's goroutine starts the taker
		var took []int
		other := NewOn(r, func(v int) { mu.Lock(); took = append(took, v); mu.Unlock() }, nil, nil)
		blocked.Put(0)
		synctest.Wait()
		other.Put(1)
		other.Put(2)
		synctest.Wait()
		mu.Lock()
		if len(took) != 0 {
			t.Fatalf("took %v while the only goroutine was blocked", took)
		}
		mu.Unlock()
		time.Sleep(stallAfter)
		synctest.Wait()
		mu.Lock()
		if len(took) != 2 || took[0] != 1 || took[1] != 2 {
			t.Fatalf("took %v after the stall, want [1 2]", took)
		}
		mu.Unlock()
		close(block)
	})
}

// A Box with many values yields to the others after turnValues of them.
func TestRunnerTurns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := NewRunner(1)
		var order []string
		gate := make(chan struct{})
		a := NewOn(r, func(v int) {
			if v == 0 {
				<-gate
			}
			order = append(order, "a")
		}, nil, nil)
		b := NewOn(r, func(int) { order = append(order, "b") }, nil, nil)
		a.Put(0)
		synctest.Wait()
		for i := 1; i <= 2*turnValues; i++ {
			a.Put(i)
		}
		b.Put(0)
		close(gate)
		synctest.Wait()
		if i := slices.Index(order, "b"); i != turnValues {
			t.Fatalf("b took its value after %d of a's, want %d", i, turnValues)
		}
	})
}

// A Box that gets a value by PutUrgent is served before those queued by Put.
func TestRunnerUrgent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := NewRunner(1)
		gate := make(chan struct{})
		var order []string
		hold := NewOn(r, func(int) { <-gate }, nil, nil)
		box := func(name string) *Box[int] {
			return NewOn(r, func(int) { order = append(order, name) }, nil, nil)
		}
		a, b, c := box("a"), box("b"), box("c")
		hold.Put(0)
		synctest.Wait()
		a.Put(0)
		b.Put(0)
		c.PutUrgent(0)
		close(gate)
		synctest.Wait()
		if want := []string{"c", "a", "b"}; !slices.Equal(order, want) {
			t.Fatalf("served %v, want %v", order, want)
		}
	})
}

// Wait returns only once every goroutine of the Runner has ended, a take
// that runs included.
func TestRunnerWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := NewRunner(2)
		release := make(chan struct{})
		b := NewOn(r, func(int) { <-release }, nil, nil)
		b.Put(1)
		synctest.Wait()
		var waited atomic.Bool
		go func() {
			r.Wait()
			waited.Store(true)
		}()
		synctest.Wait()
		if waited.Load() {
			t.Fatal("Wait returned while a take ran")
		}
		close(release)
		synctest.Wait()
		if !waited.Load() {
			t.Fatal("Wait did not return once the take ended")
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.workers != 0 || r.watching {
			t.Fatalf("after Wait: %d workers, watching %v", r.workers, r.watching)
		}
	})
}

// TakeHere takes its value on the caller's goroutine when the Box is idle,
// and only that value: one put during the take goes to a goroutine. When
// the Box is busy, it queues like Put. A closed Box refuses.
func TestTakeHere(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var b *Box[int]
		var mu sync.Mutex
		var got []int
		var onCaller atomic.Bool
		caller := make(chan struct{})
		release := make(chan struct{})
		b = New(func(v int) {
			mu.Lock()
			got = append(got, v)
			mu.Unlock()
			switch v {
			case 1:
				onCaller.Store(true)
				b.Put(2) // taken on a goroutine, after TakeHere returned
			case 3:
				close(caller)
				<-release
			}
		}, nil, nil)
		if !b.TakeHere(1) || !onCaller.Load() {
			t.Fatal("TakeHere did not take its value before it returned")
		}
		synctest.Wait()
		b.Put(3)
		<-caller // the Box is busy with 3
		if !b.TakeHere(4) {
			t.Fatal("TakeHere refused on a busy box")
		}
		mu.Lock()
		busy := slices.Contains(got, 4)
		mu.Unlock()
		if busy {
			t.Fatal("TakeHere took on the caller while the box was busy")
		}
		close(release)
		synctest.Wait()
		if !slices.Equal(got, []int{1, 2, 3, 4}) {
			t.Fatalf("got %v, want 1..4 in order", got)
		}
		b.Close()
		if b.TakeHere(5) {
			t.Fatal("TakeHere accepted on a closed box")
		}
	})
}

// On a Runner, TakeHere takes its value on the caller's goroutine when
// the Box is idle and one more goroutine may run, counted as one of the
// Runner's meanwhile: values put during the take go to the Runner. With
// every goroutine of the Runner busy, it queues like Put, and the Boxes
// queued while a caller took are served once it is done.
func TestRunnerTakeHere(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := NewRunner(1)
		var mu sync.Mutex
		var got []int
		var onCaller atomic.Bool
		caller := make(chan struct{})
		release := make(chan struct{})
		var a, other *Box[int]
		a = NewOn(r, func(v int) {
			mu.Lock()
			got = append(got, v)
			mu.Unlock()
			switch v {
			case 1:
				onCaller.Store(true)
				if n := r.Workers(); n != 1 {
					t.Errorf("%d goroutines serve the Runner during a take on the caller, want 1 (the caller)", n)
				}
				a.Put(2)     // a's next value: the Runner's, after this take
				other.Put(1) // another Box: no goroutine may start now
			case 3:
				close(caller)
				<-release
			}
		}, nil, nil)
		other = NewOn(r, func(v int) {
			mu.Lock()
			got = append(got, 100+v)
			mu.Unlock()
		}, nil, nil)
		if !a.TakeHere(1) || !onCaller.Load() {
			t.Fatal("TakeHere did not take its value before it returned")
		}
		synctest.Wait()
		mu.Lock()
		if !slices.Contains(got, 2) || !slices.Contains(got, 101) {
			t.Fatalf("took %v: the values put during the caller's take were not served after it", got)
		}
		mu.Unlock()
		a.Put(3) // blocks the Runner's one goroutine
		<-caller
		onCaller.Store(false)
		if !a.TakeHere(4) {
			t.Fatal("TakeHere refused on a busy Runner")
		}
		mu.Lock()
		busy := slices.Contains(got, 4)
		mu.Unlock()
		if busy {
			t.Fatal("TakeHere took on the caller while every goroutine of the Runner was busy")
		}
		close(release)
		synctest.Wait()
		if i, j := slices.Index(got, 3), slices.Index(got, 4); i < 0 || j < i {
			t.Fatalf("took %v, want 4 after 3", got)
		}
		r.Wait()
		if n := r.Workers(); n != 0 {
			t.Fatalf("%d goroutines left serving an idle Runner", n)
		}
	})
}

func TestRunnerHand(t *testing.T) {
	yields := 0
	yield = func() { yields++ }
	defer func() { yield = runtime.Gosched }()
	synctest.Test(t, func(t *testing.T) {
		r := NewRunner(1)
		block, release := make(chan struct{}), make(chan struct{})
		var took atomic.Int32
		a := NewOn(r, func(v int) {
			took.Add(1)
			if v == 0 {
				block <- struct{}{}
				<-release
			}
		}, nil, nil)
		b := NewOn(r, func(int) { took.Add(1) }, nil, nil)

		r.Hand(func() {})
		if yields != 0 {
			t.Fatalf("Hand yielded %d times for an f that put nothing, want 0", yields)
		}
		r.Hand(func() { a.Put(0) })
		if yields != 1 {
			t.Fatalf("Hand yielded %d times after f started a goroutine of the Runner, want 1", yields)
		}
		<-block // a's take holds the Runner's one goroutine
		r.Hand(func() { b.Put(1) })
		if yields != 1 {
			t.Fatalf("Hand yielded %d times in all, want 1: with every goroutine busy, no goroutine starts for f's put", yields)
		}
		close(release)
		synctest.Wait()
		r.Wait()
		if n := took.Load(); n != 2 {
			t.Fatalf("%d values taken, want 2", n)
		}
	})
}
