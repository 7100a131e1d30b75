package rethink_test

import (
	"io"
	"net"
	"sync"
	"testing"
)

// proxy is a TCP proxy in front of the server. Kill closes every
// connection and stops listening, as a server that dies does; Restart
// listens again on the same address, as the server coming back. It
// simulates a restart of the server from the client's side without
// touching the shared test server.
type proxy struct {
	t      testing.TB
	target string
	addr   string

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func newProxy(t testing.TB, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy: %v", err)
	}
	p := &proxy{t: t, target: target, addr: ln.Addr().String(), conns: map[net.Conn]struct{}{}}
	p.serve(ln)
	t.Cleanup(p.Kill)
	return p
}

func (p *proxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.pipe(c)
		}
	}()
}

func (p *proxy) pipe(c net.Conn) {
	u, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = c.Close()
		return
	}
	p.mu.Lock()
	if p.ln == nil { // killed meanwhile
		p.mu.Unlock()
		_ = c.Close()
		_ = u.Close()
		return
	}
	p.conns[c], p.conns[u] = struct{}{}, struct{}{}
	p.wg.Add(2)
	p.mu.Unlock()
	cp := func(dst, src net.Conn) {
		defer p.wg.Done()
		_, _ = io.Copy(dst, src)
		_ = dst.Close()
		_ = src.Close()
	}
	go cp(u, c)
	go cp(c, u)
}

// Kill stops listening, closes every proxied connection and waits for the
// proxy's goroutines. It is idempotent.
func (p *proxy) Kill() {
	p.mu.Lock()
	if p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		_ = c.Close()
		delete(p.conns, c)
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// Restart listens again on the proxy's address.
func (p *proxy) Restart() {
	p.t.Helper()
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.t.Fatalf("proxy restart on %s: %v", p.addr, err)
	}
	p.serve(ln)
}
