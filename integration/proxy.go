package integration

import (
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// Proxy is a TCP proxy on 127.0.0.1 in front of one server, for one client
// process, that can cut the client off the server and heal the cut.
//
// It is a few dozen lines of its own rather than toxiproxy: toxiproxy's
// module would add Prometheus, protobuf, zerolog, gorilla/mux and a CLI
// library to this library's go.mod, and its in-process API needs its HTTP
// API server; the two operations needed here are small.
type Proxy struct {
	ln   net.Listener
	wg   sync.WaitGroup
	done chan struct{}

	mu     sync.Mutex
	target string
	cut    bool
	closed bool
	pairs  map[*pair]struct{}
}

type pair struct{ client, server net.Conn }

// NewProxy listens on a free port of 127.0.0.1 and forwards every
// connection to target (host:port).
func NewProxy(target string) (*Proxy, error) { return ListenProxy("127.0.0.1:0", target) }

// ListenProxy listens on addr and forwards every connection to target
// (host:port): a server that starts accepting connections at an address
// its clients were already given, as a database started beside them does.
func ListenProxy(addr, target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, done: make(chan struct{}), target: target, pairs: map[*pair]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the address clients connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetTarget changes the server address for new connections.
func (p *Proxy) SetTarget(target string) {
	p.mu.Lock()
	p.target = target
	p.mu.Unlock()
}

// Cut resets every open connection on both sides and, until Heal, resets
// every new connection as soon as it is accepted: to the client it looks
// like a server that went away and refuses to come back.
func (p *Proxy) Cut() {
	p.mu.Lock()
	p.cut = true
	pairs := p.takePairs()
	p.mu.Unlock()
	for _, c := range pairs {
		c.reset()
	}
}

// Heal ends a Cut: new connections are forwarded again.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

// Conns returns how many connections are open through the proxy.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pairs)
}

// Close stops listening, resets every connection and waits for every
// goroutine of the proxy to end.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	pairs := p.takePairs()
	p.mu.Unlock()
	close(p.done)
	err := p.ln.Close()
	for _, c := range pairs {
		c.reset()
	}
	p.wg.Wait()
	return err
}

// takePairs empties the set of open pairs; p.mu is held.
func (p *Proxy) takePairs() []*pair {
	out := make([]*pair, 0, len(p.pairs))
	for c := range p.pairs {
		out = append(out, c)
	}
	clear(p.pairs)
	return out
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			select {
			case <-p.done:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			time.Sleep(5 * time.Millisecond) // e.g. too many open files
			continue
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	p.mu.Lock()
	refuse, target := p.cut || p.closed, p.target
	p.mu.Unlock()
	if refuse {
		resetConn(client)
		return
	}
	d := net.Dialer{Timeout: 2 * time.Second}
	server, err := d.Dial("tcp", target)
	if err != nil {
		resetConn(client)
		return
	}
	c := &pair{client: client, server: server}
	p.mu.Lock()
	if p.cut || p.closed { // cut while dialing
		p.mu.Unlock()
		c.reset()
		return
	}
	p.pairs[c] = struct{}{}
	p.mu.Unlock()

	var once sync.Once
	end := func() {
		once.Do(func() {
			p.mu.Lock()
			delete(p.pairs, c)
			p.mu.Unlock()
			c.client.Close()
			c.server.Close()
		})
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		_, _ = io.Copy(server, client)
		end()
	}()
	_, _ = io.Copy(client, server)
	end()
}

func (c *pair) reset() {
	resetConn(c.client)
	resetConn(c.server)
}

// resetConn closes c with a TCP reset rather than an orderly FIN, as a
// broken network path or a dead peer would look to the other side.
func resetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}
