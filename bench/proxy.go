package main

import (
	"net"
	"sync"
	"time"
)

// silentProxy forwards one node process's connections to PostgreSQL and
// can cut them silently: after cut it forwards nothing in either direction
// and sends neither FIN nor RST, so the node sees a server that stopped
// answering, as behind a dropped network path. New connections made during
// the cut are accepted and never answered.
//
// Unlike a real dropped path, the proxy's own kernel still acknowledges
// the node's packets and answers its TCP keepalives, and the server's: a
// cut here is noticed only by application timeouts. The server's keepalive
// is played by serverDrop: that long after the cut, the proxy resets its
// side of each cut connection, as PostgreSQL does when tcp_keepalives_*
// find the client gone (0: never, as with the Linux default of about 2 h).
//
// (integration.Proxy cuts with resets, which every client notices at
// once; this one is what the cut scenario needs.)
type silentProxy struct {
	ln         net.Listener
	target     string
	serverDrop time.Duration

	mu     sync.Mutex
	cut    bool
	epoch  int // bumped by cut and reset, so a late drop timer does nothing
	closed bool
	pairs  map[*proxyPair]struct{}
	wg     sync.WaitGroup
}

type proxyPair struct{ client, server net.Conn }

func newSilentProxy(target string, serverDrop time.Duration) (*silentProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &silentProxy{ln: ln, target: target, serverDrop: serverDrop, pairs: map[*proxyPair]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

func (p *silentProxy) addr() string { return p.ln.Addr().String() }

// blackhole starts a silent cut.
func (p *silentProxy) blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	p.epoch++
	if p.serverDrop > 0 {
		epoch := p.epoch
		time.AfterFunc(p.serverDrop, func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			if p.epoch != epoch {
				return
			}
			for c := range p.pairs {
				if c.server != nil {
					resetConn(c.server)
				}
			}
		})
	}
}

// reset ends the cut and resets every connection on both sides (the cut
// node is killed before this, so nobody is told anything it could use).
func (p *silentProxy) reset() {
	p.mu.Lock()
	p.cut = false
	p.epoch++
	var conns []net.Conn
	for c := range p.pairs {
		conns = append(conns, c.client)
		if c.server != nil {
			conns = append(conns, c.server)
		}
	}
	clear(p.pairs)
	p.mu.Unlock()
	for _, c := range conns {
		resetConn(c)
	}
}

func (p *silentProxy) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	_ = p.ln.Close()
	p.reset()
	p.wg.Wait()
}

func resetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

func (p *silentProxy) isCut() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cut
}

func (p *silentProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			p.mu.Lock()
			closed := p.closed
			p.mu.Unlock()
			if closed {
				return
			}
			time.Sleep(5 * time.Millisecond)
			continue
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *silentProxy) serve(client net.Conn) {
	defer p.wg.Done()
	pr := &proxyPair{client: client}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		resetConn(client)
		return
	}
	p.pairs[pr] = struct{}{}
	cut := p.cut
	p.mu.Unlock()
	if cut { // hold it, answer nothing
		buf := make([]byte, 4096)
		for {
			if _, err := client.Read(buf); err != nil {
				return
			}
		}
	}
	server, err := net.DialTimeout("tcp", p.target, 2*time.Second)
	if err != nil {
		resetConn(client)
		return
	}
	p.mu.Lock()
	pr.server = server
	p.mu.Unlock()
	done := make(chan struct{})
	go func() {
		p.pipe(server, client)
		close(done)
	}()
	p.pipe(client, server)
	<-done
}

// pipe copies from src to dst until src fails; while the proxy is cut
// what it reads is dropped.
func (p *silentProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.isCut() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				resetConn(src)
				return
			}
		}
		if err != nil {
			if !p.isCut() {
				resetConn(dst)
			}
			return
		}
	}
}
