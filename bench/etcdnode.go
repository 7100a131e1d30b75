package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
)

// etcdNodeElector is a node of kind etcd: one client, one session, and a
// concurrency.Election per election on that session, as a service with
// many elections on etcd would run them. It reports a win when Campaign
// returns and the end of every leadership when the session ends.
type etcdNodeElector struct {
	cli    *clientv3.Client
	sess   *concurrency.Session
	els    []*concurrency.Election
	cancel context.CancelFunc
	out    *nodeOut
	wg     sync.WaitGroup

	mu      sync.Mutex
	leading map[int]bool
}

func startEtcdNode(ctx context.Context, endpoint string, nf nodeFlags, out *nodeOut) (*etcdNodeElector, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, err
	}
	ttl := max(1, int(nf.bound/time.Second))
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(ttl))
	if err != nil {
		cli.Close()
		return nil, fmt.Errorf("etcd session: %w", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	n := &etcdNodeElector{cli: cli, sess: sess, cancel: cancel, out: out, leading: map[int]bool{}}
	for i := range nf.elections {
		el := concurrency.NewElection(sess, "/"+electionN(nf.election, i, nf.elections))
		n.els = append(n.els, el)
		n.wg.Go(func() {
			if err := el.Campaign(cctx, nf.id); err != nil {
				return
			}
			at := monotonic()
			n.mu.Lock()
			n.leading[i] = true
			n.mu.Unlock()
			out.elected(i, at)
		})
	}
	n.wg.Go(func() {
		select {
		case <-sess.Done():
		case <-cctx.Done():
			return
		}
		at := monotonic()
		n.mu.Lock()
		defer n.mu.Unlock()
		for i := range n.leading {
			out.unelected(i, at, "session-ended")
		}
		clear(n.leading)
	})
	return n, nil
}

func (n *etcdNodeElector) resign(i int) {
	start := monotonic()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := n.els[i].Resign(ctx)
	n.out.resigning(i, start)
	if err == nil {
		n.mu.Lock()
		if n.leading[i] {
			delete(n.leading, i)
			n.out.unelected(i, monotonic(), "resigned")
		}
		n.mu.Unlock()
	}
}

func (n *etcdNodeElector) stop() {
	n.cancel()
	n.wg.Wait()
	_ = n.sess.Close()
	n.cli.Close()
}
