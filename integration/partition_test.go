//go:build linux

package integration

import (
	"archive/tar"
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leaderfeed/leaderfeed/internal/testenv"
)

// Faults of the partition test: real network partitions between containers.
const (
	// faultPartition takes the leader's container off the Docker network
	// (docker network disconnect) until another node leads, then puts it
	// back with the same address, so that its TCP connections may live on.
	faultPartition = "partition"
	// faultPartitionFollower takes a follower off the network for longer
	// than the election timeout; it must not lead while cut off.
	faultPartitionFollower = "partition-follower"
	// faultPause freezes the leader's container (docker pause: the cgroup
	// freezer) for longer than its lease.
	faultPause = "pause"
)

var partitionKinds = []string{faultPartition, faultPartitionFollower, faultPause}

// partitionsPerKindInCI is how many faults of each kind a run that is no
// soak injects: 16 partitions and 8 pauses, about a minute.
const partitionsPerKindInCI = 8

// TestFaultsPostgresPartition runs five node processes, each in a container
// of its own, against PostgreSQL in a container, all on one Docker network,
// and partitions them for real: the leader's container is disconnected from
// the network (it must step down by the end of its lease and another node
// must lead within the bound), a follower's is (it must never lead while
// cut off), or the leader's container is frozen. The node program is built
// as a static binary (CGO_ENABLED=0, so without the race detector) into an
// image of its own (docker import of a tar holding only the binary). Every
// container shares the machine's kernel and so its CLOCK_MONOTONIC: the
// node's lines are checked by the same Checker as the other fault tests.
//
// It needs Docker and a PostgreSQL image (LEADERFEED_POSTGRES_IMAGE, else
// postgres:16-alpine); without Docker it skips (the proxy cuts of
// TestFaultsPostgres stand in), except where the test script set Docker up
// (LEADERFEED_DOCKER=1), where it fails.
//
// LEADERFEED_SOAK=<faults> makes it a soak, the faults spread evenly over
// the three kinds and the summary printed:
//
//	LEADERFEED_SOAK=300 go test -count=1 -run TestFaultsPostgresPartition -v -timeout 1h ./integration/
func TestFaultsPostgresPartition(t *testing.T) {
	img := os.Getenv("LEADERFEED_POSTGRES_IMAGE")
	if img == "" {
		img = "postgres:16-alpine"
	}
	if !testenv.DockerCanRun(img) {
		if testenv.DockerSetUp() || testenv.InCI() {
			t.Fatalf("no container of %s can be started, in CI or after .ci/docker.sh set an engine up (LEADERFEED_DOCKER=1)", img)
		}
		t.Skip("skipped: network partitions between containers need Docker and a PostgreSQL image; TestFaultsPostgres's proxy cuts stand in")
	}
	// No deadline of its own: a soak runs as long as it needs (each docker
	// command is bounded by dockerTimeout, the test by go test -timeout).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := newDockerNet(ctx, t, img)

	cfg := configFor(t, partitionKinds)
	if soakFaults(t) == 0 {
		cfg.perKind = partitionsPerKindInCI
	}
	cfg.label = "postgres in containers, partitions"
	h := newHarness(t, d, cfg)
	h.command = d.nodeCommand(h)
	// Registered after newHarness, so it runs before the harness kills the
	// docker clients: removing a container ends its client, while killing
	// a client would leave its container running.
	t.Cleanup(d.removeNodes)
	runPartitions(ctx, h, d)
}

// dockerNet is one test's Docker network, its PostgreSQL container and
// the node image; all are removed at cleanup.
type dockerNet struct {
	t       *testing.T
	prefix  string // of every name: lf-it-<random>
	network string
	subnet  string // the first three octets, e.g. "10.213.7"
	pgImage string
	pg      string // container name
	pass    string
	host    string // 127.0.0.1:port published for the test itself
	node    string // image of the node program
}

// dockerTimeout bounds one docker command.
const dockerTimeout = 2 * time.Minute

// docker runs the docker command and returns its trimmed output.
func docker(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, dockerTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("docker %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return string(bytes.TrimSpace(out)), nil
}

func newDockerNet(ctx context.Context, t *testing.T, img string) *dockerNet {
	t.Helper()
	b := make([]byte, 4)
	_, _ = crand.Read(b)
	d := &dockerNet{t: t, prefix: "lf-it-" + hex.EncodeToString(b), pgImage: img}
	d.network, d.pg, d.node = d.prefix, d.prefix+"-pg", "leaderfeed/it-node:"+d.prefix
	pass := make([]byte, 16)
	_, _ = crand.Read(pass)
	d.pass = hex.EncodeToString(pass)

	// A subnet of our choosing, so that a node reconnected after a
	// partition gets its address back (--ip needs a configured subnet).
	var err error
	for range 20 {
		d.subnet = fmt.Sprintf("10.%d.%d", 200+rand.IntN(50), rand.IntN(256))
		if _, err = docker(ctx, "network", "create", "--subnet", d.subnet+".0/24", d.network); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = docker(context.Background(), "network", "rm", d.network) })

	began := time.Now()
	if _, err := docker(ctx, "run", "-d", "--name", d.pg, "--network", d.network, "--ip", d.subnet+".2",
		"-p", "127.0.0.1::5432", "-e", "POSTGRES_PASSWORD="+d.pass, d.pgImage, "postgres",
		"-c", "fsync=off", "-c", "max_connections=300",
		// A node's connections cut by a partition that does not heal in
		// time are reaped within seconds rather than hours.
		"-c", "tcp_keepalives_idle=5", "-c", "tcp_keepalives_interval=2", "-c", "tcp_keepalives_count=3"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			if logs, err := docker(context.Background(), "logs", "--tail", "30", d.pg); err == nil {
				t.Logf("PostgreSQL container's log ends:\n%s", logs)
			}
		}
		_, _ = docker(context.Background(), "rm", "-f", "-v", d.pg)
	})
	port, err := docker(ctx, "port", d.pg, "5432/tcp")
	if err != nil {
		t.Fatal(err)
	}
	d.host = strings.TrimSpace(strings.Split(port, "\n")[0])
	if err := d.waitReady(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("PostgreSQL container (%s) ready in %v", d.pgImage, time.Since(began).Round(time.Millisecond))

	began = time.Now()
	if err := d.buildNodeImage(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = docker(context.Background(), "rmi", "-f", d.node) })
	t.Logf("node image %s built in %v", d.node, time.Since(began).Round(time.Millisecond))
	return d
}

// url is the PostgreSQL URL with host:port hp.
func (d *dockerNet) url(hp string) string {
	u := url.URL{Scheme: "postgres", User: url.UserPassword("postgres", d.pass), Host: hp, Path: "/postgres",
		RawQuery: "sslmode=disable&connect_timeout=2"}
	return u.String()
}

// waitReady waits until the server in the container answers over TCP (the
// image's first server, which creates the database, listens only on its
// unix socket).
func (d *dockerNet) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(cctx, d.url(d.host))
		if err == nil {
			err = conn.Ping(cctx)
			conn.Close(context.Background())
		}
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("PostgreSQL container not ready after %v: %v", timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// buildNodeImage builds the node program as a static binary and makes an
// image holding only it.
func (d *dockerNet) buildNodeImage(ctx context.Context) error {
	bin := filepath.Join(d.t.TempDir(), "node")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./node")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("CGO_ENABLED=0 go build ./node: %v\n%s", err, out)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: "node", Mode: 0o755, Size: int64(len(data)), ModTime: time.Now()}); err != nil {
		return err
	}
	if _, err := tw.Write(data); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	imp := exec.CommandContext(ctx, "docker", "import", "--change", `ENTRYPOINT ["/node"]`, "-", d.node)
	imp.Stdin = &buf
	if out, err := imp.CombinedOutput(); err != nil {
		return fmt.Errorf("docker import of the node image: %v: %s", err, out)
	}
	return nil
}

// server: the harness's view. The proxies it makes in front of targets()
// go unused: the nodes reach the server over the Docker network.
func (d *dockerNet) name() string                  { return "postgres" }
func (d *dockerNet) targets() []string             { return []string{d.host} }
func (d *dockerNet) nodeURL([]string) string       { return d.url(d.subnet + ".2:5432") }
func (d *dockerNet) restart(context.Context) error { return errUnsupported }
func (d *dockerNet) prepare(ctx context.Context, election string) error {
	return pgPrepare(ctx, d.url(d.host), election)
}
func (d *dockerNet) killFeeds(context.Context, []string) (int, error) {
	return 0, errUnsupported
}
func (d *dockerNet) failover(context.Context) (int64, int64, error) { return 0, 0, errUnsupported }

// ip is the address of the node container of slot i.
func (d *dockerNet) ip(slot int) string { return fmt.Sprintf("%s.%d", d.subnet, 10+slot) }

// container names the container of node id (n1, n2, ...).
func (d *dockerNet) container(id string) string { return d.prefix + "-" + id }

// nodeCommand returns the harness's command hook: a node is `docker run`
// of the node image, attached, so that the harness reads its lines from the
// client's stdout and the client passes SIGTERM on to the node.
func (d *dockerNet) nodeCommand(h *harness) func(id string) *exec.Cmd {
	return func(id string) *exec.Cmd {
		var slot int
		fmt.Sscanf(id, "n%d", &slot)
		slot--
		tm := h.cfg.timing
		return exec.Command("docker", "run", "--rm", "--name", d.container(id),
			"--network", d.network, "--ip", d.ip(slot),
			"-e", "LEADERFEED_NODE_URL="+d.nodeURL(nil),
			d.node,
			"-backend", "postgres",
			"-election", h.cfg.election,
			"-id", id,
			"-heartbeat", tm.HeartbeatInterval.String(),
			"-emin", tm.ElectionTimeoutMin.String(),
			"-emax", tm.ElectionTimeoutMax.String(),
		)
	}
}

// removeNodes removes every node container that is left.
func (d *dockerNet) removeNodes() {
	ids, err := docker(context.Background(), "ps", "-aq", "--filter", "name="+d.prefix+"-n")
	if err != nil || ids == "" {
		return
	}
	// A container left frozen by a failed pause fault cannot be killed.
	_, _ = docker(context.Background(), append([]string{"unpause"}, strings.Fields(ids)...)...)
	_, _ = docker(context.Background(), append([]string{"rm", "-f"}, strings.Fields(ids)...)...)
}

func (d *dockerNet) disconnect(ctx context.Context, p *proc) error {
	_, err := docker(ctx, "network", "disconnect", d.network, d.container(p.id))
	return err
}

func (d *dockerNet) connect(ctx context.Context, p *proc) error {
	_, err := docker(ctx, "network", "connect", "--ip", d.ip(p.slot), d.network, d.container(p.id))
	return err
}

// partitionStats are measured around the faults, for the summary.
type partitionStats struct {
	cutoffLed []string        // a follower that led while cut off
	dockerOps []time.Duration // docker disconnect, connect, pause, unpause
}

// runPartitions is the harness's run with the partition faults: it starts
// the nodes, injects the faults one by one once the nodes are stable, and
// checks the logs.
func runPartitions(ctx context.Context, h *harness, d *dockerNet) {
	t := h.t
	if err := h.srv.prepare(ctx, h.cfg.election); err != nil {
		t.Fatalf("prepare: %v", err)
	}
	began := time.Now()
	for i := range h.cfg.nodes {
		if err := h.start(i); err != nil {
			t.Fatal(err)
		}
	}
	// Starting five containers takes seconds, more on a loaded machine:
	// wait for them longer than stable() does between faults.
	if err := h.waitFor("every node container up with its feed and one leader", 3*time.Minute, func() bool {
		for _, p := range h.slots {
			if !p.started || !p.feedUp || p.end != 0 {
				return false
			}
		}
		return h.leaderLocked() != nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d node containers up with a leader in %v", h.cfg.nodes, time.Since(began).Round(time.Millisecond))
	st := &partitionStats{}
	elapsed, failed := h.injectAll(ctx, 50, func(ctx context.Context, kind string, leader *proc) error {
		return injectPartition(ctx, h, d, st, kind, leader)
	})
	if failed != nil {
		t.Error(failed)
	}
	logs, faults := h.collect()
	rep := Check(logs, faults, h.cfg.bound)
	// A follower cut off must not lead until it is back.
	for _, f := range faults {
		if f.Kind != faultPartitionFollower {
			continue
		}
		for _, iv := range rep.Intervals {
			if iv.Proc == f.Victim && iv.Start >= f.At && iv.Start <= f.Ref {
				st.cutoffLed = append(st.cutoffLed, fmt.Sprintf("fault %d: %s led while cut off: %v", f.Seq, f.Victim, iv))
			}
		}
	}
	summary := fmt.Sprintf("%s: %d faults in %v, %d leadership intervals, seed %d\n\n%s\n%s\nfollowers that led while cut off: %d; docker network disconnect/connect/pause/unpause: median %s, p99 %s, worst %s",
		h.cfg.label, len(faults), elapsed.Round(time.Second), len(rep.Intervals), h.cfg.seed,
		rep.Summary(faults, h.cfg.kinds), rep.Counts(), len(st.cutoffLed),
		pct(st.dockerOps, 0.5), pct(st.dockerOps, 0.99), pct(st.dockerOps, 1))
	if soakFaults(t) > 0 {
		fmt.Println(summary)
	} else {
		t.Log("\n" + summary)
	}
	for _, m := range st.cutoffLed {
		t.Error(m)
	}
	if err := rep.Err(); err != nil {
		h.keepLogs(logs, faults)
		t.Error(err)
	}
}

// injectPartition injects one fault and waits until the nodes have
// recovered from it.
func injectPartition(ctx context.Context, h *harness, d *dockerNet, st *partitionStats, kind string, leader *proc) error {
	tm, bound := h.cfg.timing, h.cfg.bound
	h.mu.Lock()
	term := leader.term
	h.mu.Unlock()
	timed := func(f func() error) error {
		t0 := time.Now()
		err := f()
		st.dockerOps = append(st.dockerOps, time.Since(t0))
		return err
	}
	switch kind {
	case faultPartition:
		at := Monotonic()
		if err := timed(func() error { return d.disconnect(ctx, leader) }); err != nil {
			return err
		}
		// Once disconnect has returned the container has no interface on
		// the network: nothing it sends arrives, so no renewal sent later
		// can be acknowledged and its lease ends by then plus
		// LeaseDuration. The partition lasts until another node leads,
		// which is after that.
		h.record(Fault{Kind: kind, Victim: leader.name, At: at, NewLeader: true,
			LeaseEndBy: Monotonic() + int64(tm.LeaseDuration)})
		err := h.waitFor("a new leader while the old one is partitioned", bound+5*time.Second, func() bool {
			l := h.leaderLocked()
			return l != nil && l != leader && l.term > term && leader.term == 0
		})
		// Sometimes heal at once, sometimes after up to an election
		// timeout more.
		time.Sleep(time.Duration(h.rng.Int64N(int64(tm.ElectionTimeoutMax))))
		if cerr := timed(func() error { return d.connect(ctx, leader) }); err == nil {
			err = cerr
		}
		return err

	case faultPartitionFollower:
		var victim *proc
		for victim == nil || victim == leader {
			victim = h.slots[h.rng.IntN(len(h.slots))]
		}
		// Longer than the election timeout: the victim hears no heartbeat
		// and campaigns, and must not win.
		lo, hi := tm.ElectionTimeoutMax+100*time.Millisecond, tm.ElectionTimeoutMax+600*time.Millisecond
		hold := lo + time.Duration(h.rng.Int64N(int64(hi-lo)))
		at := Monotonic()
		if err := timed(func() error { return d.disconnect(ctx, victim) }); err != nil {
			return err
		}
		time.Sleep(hold)
		healed := Monotonic()
		if err := timed(func() error { return d.connect(ctx, victim) }); err != nil {
			return err
		}
		// A leader must exist when the follower is back (the old one, most
		// likely) or be elected within the bound.
		h.record(Fault{Kind: kind, Victim: victim.name, At: at, Ref: healed})
		return h.waitFor("a leader after the follower's partition", bound+5*time.Second, func() bool {
			return h.leaderLocked() != nil
		})

	case faultPause:
		lo, hi := tm.LeaseDuration+20*time.Millisecond, tm.ElectionTimeoutMax+200*time.Millisecond
		hold := lo + time.Duration(h.rng.Int64N(int64(hi-lo)))
		at := Monotonic()
		if err := timed(func() error { _, err := docker(ctx, "pause", d.container(leader.id)); return err }); err != nil {
			return err
		}
		// docker pause returns once the cgroup is frozen: no renewal can
		// be sent after it.
		h.record(Fault{Kind: kind, Victim: leader.name, At: at, NewLeader: true,
			LeaseEndBy: Monotonic() + int64(tm.LeaseDuration)})
		time.Sleep(hold)
		if err := timed(func() error { _, err := docker(ctx, "unpause", d.container(leader.id)); return err }); err != nil {
			return err
		}
		return h.waitFor(fmt.Sprintf("the paused leader (%v) to step down and a leader", hold), bound+5*time.Second, func() bool {
			l := h.leaderLocked()
			return l != nil && l.term > term
		})
	}
	return fmt.Errorf("unknown fault %q", kind)
}
