package integration

import (
	"bufio"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// echoServer answers every line with the same line until closed.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

func roundTrip(c net.Conn) error {
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return err
	}
	_, err := bufio.NewReader(c).ReadString('\n')
	return err
}

// A cut breaks the open connections and refuses new ones; a heal lets new
// ones through again.
func TestProxyCutHeal(t *testing.T) {
	p, err := NewProxy(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	c1, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	if err := roundTrip(c1); err != nil {
		t.Fatalf("through the proxy: %v", err)
	}
	if p.Conns() != 1 {
		t.Fatalf("Conns() = %d, want 1", p.Conns())
	}

	p.Cut()
	if err := roundTrip(c1); err == nil {
		t.Fatal("an open connection still works after Cut")
	}
	if c2, err := net.Dial("tcp", p.Addr()); err == nil {
		err = roundTrip(c2)
		c2.Close()
		if err == nil {
			t.Fatal("a new connection works during a cut")
		}
	}

	p.Heal()
	c3, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	if err := roundTrip(c3); err != nil {
		t.Fatalf("after Heal: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := roundTrip(c3); err == nil {
		t.Fatal("a connection works after Close")
	}
}
