package mailbox

import (
	"sync"
	"testing"
	"testing/synctest"
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
		if n, ok := b.Replace(4, func(v int) bool { return v%2 == 1 }); n != 2 || !ok {
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
