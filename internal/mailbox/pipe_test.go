package mailbox

import (
	"context"
	"slices"
	"testing"
	"testing/synctest"
	"time"
)

// drain reads c until it closes.
func drain(c <-chan int) []int {
	var got []int
	for v := range c {
		got = append(got, v)
	}
	return got
}

// A lagging reader gets every value in order, then End's last, then the
// channel closes and onEnd runs once; no goroutine is left.
func TestPipeOrderAndEnd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ends := 0
		p := NewPipe[int](t.Context(), 1, func() { ends++ })
		for i := range 100 {
			if !p.Put(i) {
				t.Fatalf("Put(%d) refused on an open pipe", i)
			}
		}
		p.End(-1, false)
		if p.Put(100) {
			t.Fatal("Put accepted after End")
		}
		got := drain(p.C())
		want := append(slicesRange(100), -1)
		if !slices.Equal(got, want) {
			t.Fatalf("got %v, want 0..99 then -1", got)
		}
		synctest.Wait()
		if ends != 1 {
			t.Fatalf("onEnd ran %d times, want 1", ends)
		}
	})
}

func slicesRange(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// Replace drops the waiting values it finds stale; End with drop drops
// all of them.
func TestPipeReplaceAndDrop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := NewPipe[int](t.Context(), 1, nil)
		p.Put(1) // into the channel
		p.Put(2)
		p.Put(3)
		p.Put(10)
		p.Replace(4, func(v int) bool { return v < 10 }) // drops 2 and 3
		if n := p.Len(); n != 2 {
			t.Fatalf("Len %d, want 2 (10 and 4)", n)
		}
		if got := <-p.C(); got != 1 {
			t.Fatalf("first %d, want 1", got)
		}
		synctest.Wait() // 10 in the channel, the taker sending 4
		p.Put(5)
		p.End(-1, true) // drops 5
		if got := drain(p.C()); !slices.Equal(got, []int{10, 4, -1}) {
			t.Fatalf("got %v, want [10 4 -1]", got)
		}
	})
}

// The reader's context ending closes the channel without delivering what
// waits, also while a value is being sent; later puts are refused.
func TestPipeReaderGone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		ends := 0
		p := NewPipe[int](ctx, 1, func() { ends++ })
		for i := range 5 {
			p.Put(i)
		}
		synctest.Wait() // 0 in the channel, the taker sending 1
		cancel()
		synctest.Wait()
		if p.Put(9) {
			t.Fatal("Put accepted after the reader left")
		}
		got := drain(p.C())
		if len(got) > 2 || (len(got) > 0 && got[0] != 0) {
			t.Fatalf("got %v after the reader left, want at most what the channel held", got)
		}
		p.End(-1, false)
		p.Abort()
		synctest.Wait()
		if ends != 1 {
			t.Fatalf("onEnd ran %d times, want 1", ends)
		}
	})
}

// An idle pipe holds no goroutine: a value goes straight into the
// channel when it has room.
func TestPipeDirect(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := NewPipe[int](t.Context(), 2, nil)
		p.Put(1)
		p.Put(2)
		if p.taking != 0 || p.Len() != 0 {
			t.Fatalf("taking %d, waiting %d: want both in the channel", p.taking, p.Len())
		}
		p.Put(3)
		if p.Len()+p.taking == 0 {
			t.Fatal("a third value did not wait for a full channel")
		}
		if got := []int{<-p.C(), <-p.C(), <-p.C()}; !slices.Equal(got, []int{1, 2, 3}) {
			t.Fatalf("got %v", got)
		}
		p.Abort()
		if _, ok := <-p.C(); ok {
			t.Fatal("channel open after Abort")
		}
	})
}

// Finish delivers what waits and closes; with patience, a reader that
// took a value gets each of the rest if it takes it within patience, and
// what it leaves longer is dropped and counted; a reader that never took
// one is not waited for at all.
func TestPipeFinish(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := NewPipe[int](t.Context(), 0, nil)
		var sent []int
		p.OnSent(func(v int) { sent = append(sent, v) })
		for i := range 3 {
			p.Put(i)
		}
		p.Finish(0, nil)
		time.Sleep(time.Hour) // no patience: the values wait
		if got := drain(p.C()); !slices.Equal(got, []int{0, 1, 2}) || !slices.Equal(sent, got) {
			t.Fatalf("got %v, sent %v; want 0..2 both", got, sent)
		}

		dropped := 0
		p = NewPipe[int](t.Context(), 0, nil)
		go func() { <-p.C() }()
		synctest.Wait()
		p.Put(0) // taken at once
		for i := 1; i < 4; i++ {
			p.Put(i)
		}
		p.Finish(time.Second, func(n int) { dropped += n })
		time.Sleep(999 * time.Millisecond)
		if got := <-p.C(); got != 1 {
			t.Fatalf("got %d within patience, want 1", got)
		}
		time.Sleep(1001 * time.Millisecond)
		if got := drain(p.C()); len(got) != 0 || dropped != 2 {
			t.Fatalf("after patience: got %v, %d dropped; want none, 2 dropped", got, dropped)
		}

		dropped = 0
		p = NewPipe[int](t.Context(), 0, nil)
		p.Put(0)
		p.Put(1)
		synctest.Wait()
		p.Finish(time.Second, func(n int) { dropped += n })
		synctest.Wait()
		if got := drain(p.C()); len(got) != 0 || dropped != 2 {
			t.Fatalf("a reader that took nothing: got %v, %d dropped; want none, 2 dropped", got, dropped)
		}
	})
}

// A pipe whose reader's context has ended already ends at once.
func TestPipeContextEndedBefore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		ends := 0
		p := NewPipe[int](ctx, 1, func() { ends++ })
		synctest.Wait()
		_, open := <-p.C()
		if put := p.Put(1); open || ends != 1 || put {
			t.Fatalf("after the context ended: channel open %v, onEnd ran %d times, Put accepted %v", open, ends, put)
		}
	})
}

// A Pipe keeps the room of its last burst once the reader took it all
// (maxKeptPipe), where an engine's Box frees it (maxKept): a changefeed's
// Pipe gets a burst per batch written.
func TestPipeKeepsBurstRoom(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := NewPipe[int](context.Background(), 1, nil)
		const burst = 100
		for i := range burst {
			p.Put(i)
		}
		for range burst {
			<-p.C()
		}
		synctest.Wait() // the pipe's goroutine ended: the box is idle
		p.box.mu.Lock()
		room := cap(p.box.queue)
		p.box.mu.Unlock()
		if room < burst-1 {
			t.Fatalf("an idle Pipe kept room for %d values after a burst of %d", room, burst)
		}
		p.End(0, false)
		<-p.C()

		b := New(func(int) {}, nil, nil)
		for i := range burst {
			b.Put(i)
		}
		synctest.Wait()
		b.mu.Lock()
		room = cap(b.queue)
		b.mu.Unlock()
		if room > maxKept {
			t.Fatalf("an idle Box kept room for %d values, want at most %d", room, maxKept)
		}
	})
}

// PutAll delivers a burst in order after what waits, through the pipe's
// goroutine (the caller sends nothing itself); one value goes straight
// into the channel like Put; an ended pipe refuses a burst.
func TestPipePutAll(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := NewPipe[int](t.Context(), 0, nil)
		p.Put(0) // waits: no reader yet
		if !p.PutAll([]int{1, 2, 3}) {
			t.Fatal("PutAll refused on an open pipe")
		}
		if got := []int{<-p.C(), <-p.C(), <-p.C(), <-p.C()}; !slices.Equal(got, []int{0, 1, 2, 3}) {
			t.Fatalf("got %v, want 0..3", got)
		}
		synctest.Wait()
		q := NewPipe[int](t.Context(), 1, nil)
		q.PutAll([]int{7})
		if q.taking != 0 || q.Len() != 0 {
			t.Fatalf("taking %d, waiting %d: want one value straight into the channel", q.taking, q.Len())
		}
		q.PutAll([]int{8, 9})
		if q.Len()+q.taking == 0 {
			t.Fatal("a burst did not go to the pipe's goroutine")
		}
		q.End(10, false)
		if q.PutAll([]int{11, 12}) {
			t.Fatal("PutAll accepted after End")
		}
		if got := drain(q.C()); !slices.Equal(got, []int{7, 8, 9, 10}) {
			t.Fatalf("got %v, want 7..10", got)
		}
		p.Abort()
	})
}
