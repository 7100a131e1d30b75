//go:build linux

package integration

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/modules/mongodb"
	"github.com/testcontainers/testcontainers-go/wait"
	mongodrv "go.mongodb.org/mongo-driver/v2/mongo"
	mongoopts "go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.uber.org/goleak"
	r "gopkg.in/rethinkdb/rethinkdb-go.v6"

	"github.com/leaderfeed/leaderfeed/internal/testenv"
	"github.com/leaderfeed/leaderfeed/mongo"
	"github.com/leaderfeed/leaderfeed/rethink"
)

// The stand-ins of the other packages cannot serve here: lungo runs inside
// one process, and reqlite's compare-and-set is not atomic across
// connections. So MongoDB and RethinkDB are tested only on a real server,
// given in the environment or started in Docker, and only with the faults
// that need no control of the server (kill, stop, cut).
var nodeFaults = []string{faultKill, faultStop, faultCut}

const itDatabase = "leaderfeed_it"

// containerStarted notes that goroutines of testcontainers-go and the
// Docker client may outlive the test.
func containerStarted() {
	leakOptions = append(leakOptions,
		goleak.IgnoreAnyFunction("github.com/testcontainers/testcontainers-go.(*Reaper).connect.func1"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("internal/poll.runtime_pollWait"))
}

// TestFaultsMongo runs the node faults against a real MongoDB replica set:
// LEADERFEED_MONGO_URL, else a mongo:7 container when Docker works, else
// it is skipped (there is no usable stand-in).
func TestFaultsMongo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	u := os.Getenv("LEADERFEED_MONGO_URL")
	requested := u != ""
	if !requested {
		if !testenv.DockerCanRun("mongo:7") {
			t.Skip("skipped, also in CI by design: cross-process faults need a real MongoDB (LEADERFEED_MONGO_URL, or Docker with mongo:7, which cannot be pulled or built in CI); lungo is in-process only")
		}
		containerStarted()
		c, err := mongodb.Run(ctx, "mongo:7", mongodb.WithReplicaSet("rs0"))
		if c != nil {
			t.Cleanup(func() { _ = c.Terminate(context.Background()) })
		}
		if err != nil {
			testenv.Unavailable(t, fmt.Sprintf("Docker works but a mongo:7 container did not start: %v", err))
		}
		if u, err = c.ConnectionString(ctx); err != nil {
			t.Fatal(err)
		}
	}
	srv, err := newMongoServer(u)
	if err == nil {
		err = srv.prepare(ctx, "integration")
	}
	if err != nil {
		testenv.Unavailable(t, fmt.Sprintf("no usable MongoDB: %v", err))
	}
	h := newHarness(t, srv, configFor(t, nodeFaults))
	h.run(context.Background())
}

type mongoServer struct{ u *url.URL }

func newMongoServer(raw string) (*mongoServer, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, err
	}
	if u.Scheme != "mongodb" || u.Host == "" {
		return nil, fmt.Errorf("want a mongodb://host:port URL of one server, got scheme %q", u.Scheme)
	}
	return &mongoServer{u: u}, nil
}

func (s *mongoServer) name() string      { return "mongo" }
func (s *mongoServer) targets() []string { return []string{s.u.Host} }

func (s *mongoServer) nodeURL(proxies []string) string {
	u := *s.u
	u.Host = proxies[0]
	return u.String()
}

func (s *mongoServer) prepare(ctx context.Context, election string) error {
	client, err := mongodrv.Connect(mongoopts.Client().ApplyURI(s.u.String()).SetDirect(true))
	if err != nil {
		return err
	}
	defer client.Disconnect(context.Background())
	b, err := mongo.New(client.Database(itDatabase), election, mongo.Options{})
	if err != nil {
		return err
	}
	defer b.Close()
	if err := b.Start(ctx); err != nil {
		return err
	}
	return b.Create(ctx)
}

func (s *mongoServer) restart(context.Context) error { return errUnsupported }
func (s *mongoServer) killFeeds(context.Context, []string) (int, error) {
	return 0, errUnsupported
}
func (s *mongoServer) failover(context.Context) (int64, int64, error) { return 0, 0, errUnsupported }

// TestFaultsRethink runs the node faults against a real RethinkDB:
// LEADERFEED_RETHINK_ADDR unless it is reqlite (LEADERFEED_RETHINK_REQLITE=1,
// as .ci/rethink.sh sets), else a rethinkdb:2.4 container when Docker
// works, else it is skipped.
func TestFaultsRethink(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	addr := os.Getenv("LEADERFEED_RETHINK_ADDR")
	if os.Getenv("LEADERFEED_RETHINK_REQLITE") == "1" {
		addr = "" // not atomic: no evidence
	}
	if addr == "" {
		if !testenv.DockerCanRun("rethinkdb:2.4") {
			t.Skip("skipped, also in CI by design: cross-process faults need a real RethinkDB (LEADERFEED_RETHINK_ADDR, or Docker with rethinkdb:2.4, which cannot be pulled or built in CI); reqlite is not atomic")
		}
		containerStarted()
		c, err := testcontainers.Run(ctx, "rethinkdb:2.4",
			testcontainers.WithExposedPorts("28015/tcp"),
			testcontainers.WithWaitStrategy(wait.ForListeningPort("28015/tcp")))
		if c != nil {
			t.Cleanup(func() { _ = c.Terminate(context.Background()) })
		}
		if err != nil {
			testenv.Unavailable(t, fmt.Sprintf("Docker works but a rethinkdb:2.4 container did not start: %v", err))
		}
		if addr, err = c.PortEndpoint(ctx, "28015/tcp", ""); err != nil {
			t.Fatal(err)
		}
	}
	srv := rethinkServer{addr: addr}
	if err := srv.prepare(ctx, "integration"); err != nil {
		testenv.Unavailable(t, fmt.Sprintf("RethinkDB at %s: %v", addr, err))
	}
	h := newHarness(t, srv, configFor(t, nodeFaults))
	h.run(context.Background())
}

type rethinkServer struct{ addr string }

func (s rethinkServer) name() string                    { return "rethink" }
func (s rethinkServer) targets() []string               { return []string{s.addr} }
func (s rethinkServer) nodeURL(proxies []string) string { return proxies[0] }

func (s rethinkServer) prepare(ctx context.Context, election string) error {
	session, err := r.Connect(r.ConnectOpts{Address: s.addr, Timeout: 5 * time.Second})
	if err != nil {
		return err
	}
	defer session.Close()
	b, err := rethink.NewStore(session, rethink.Options{Database: itDatabase})
	if err != nil {
		return err
	}
	defer b.Close()
	if err := b.Start(ctx); err != nil {
		return err
	}
	return b.Create(ctx)
}

func (s rethinkServer) restart(context.Context) error { return errUnsupported }
func (s rethinkServer) killFeeds(context.Context, []string) (int, error) {
	return 0, errUnsupported
}
func (s rethinkServer) failover(context.Context) (int64, int64, error) { return 0, 0, errUnsupported }
