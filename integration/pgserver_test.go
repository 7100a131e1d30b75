//go:build linux

package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leaderfeed/leaderfeed/internal/testenv"
	"github.com/leaderfeed/leaderfeed/postgres"
)

// pgServer is a private PostgreSQL cluster in a directory of the test's
// own (t.TempDir), made with the same Debian binaries as .ci/postgres.sh
// uses, so that the test can restart it without disturbing the server
// other packages test on. The directory holds the data directory (data),
// the server's log (server.log) and its unix socket.
type pgServer struct {
	bin, dir string
	port     int
	pass     string
	asRoot   bool // commands run as user postgres through runuser
	uid, gid int  // of user postgres, when asRoot
	// settings are -c options of this server beyond the common ones.
	settings string
	restarts int
	// killed is set while the server is known dead after a SIGKILL, so
	// that cleanup does not signal a process id that may have been reused.
	killed bool
}

func pgBinDir() (string, bool) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int { // highest version first
		va, _ := strconv.Atoi(filepath.Base(filepath.Dir(a)))
		vb, _ := strconv.Atoi(filepath.Base(filepath.Dir(b)))
		return vb - va
	})
	for _, d := range dirs {
		if isExec(filepath.Join(d, "initdb")) && isExec(filepath.Join(d, "pg_ctl")) {
			return d, true
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if _, err := exec.LookPath("pg_ctl"); err == nil {
			return filepath.Dir(p), true
		}
	}
	return "", false
}

func isExec(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode()&0o111 != 0
}

// newPG returns a server that is neither initialized nor started: the
// binaries, a directory under t.TempDir the server's user can write, and a
// free port of 127.0.0.1. At cleanup the server is stopped (immediate
// shutdown) before the directory is removed.
func newPG(t *testing.T) *pgServer {
	t.Helper()
	bin, ok := pgBinDir()
	if !ok {
		testenv.Unavailable(t, "no PostgreSQL server binaries (initdb, pg_ctl): install Debian's postgresql package")
	}
	s := &pgServer{bin: bin, asRoot: os.Geteuid() == 0, settings: "-c full_page_writes=off"}
	if s.asRoot {
		u, err := user.Lookup("postgres")
		if err != nil {
			testenv.Unavailable(t, "running as root but there is no user postgres to run the server")
		}
		s.uid, _ = strconv.Atoi(u.Uid)
		s.gid, _ = strconv.Atoi(u.Gid)
	}
	s.dir = t.TempDir()
	if s.asRoot {
		// t.TempDir's parent is private to root; user postgres needs to
		// pass through it to its own directory.
		if err := os.Chmod(filepath.Dir(s.dir), 0o711); err != nil {
			t.Fatal(err)
		}
		if err := s.chown(s.dir); err != nil {
			t.Fatal(err)
		}
	}
	// Registered after t.TempDir, so it runs before the directory goes.
	t.Cleanup(func() {
		if !s.killed {
			_ = s.pgctl(context.Background(), "-m", "immediate", "-w", "-t", "30", "stop")
		}
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.port = ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return s
}

// chown gives p to the server's user, when the tests run as root.
func (s *pgServer) chown(p string) error {
	if !s.asRoot {
		return nil
	}
	return os.Chown(p, s.uid, s.gid)
}

// initdb creates the cluster with a random password for user postgres
// (scram-sha-256 over TCP, trust on the unix socket).
func (s *pgServer) initdb(ctx context.Context) error {
	pass := make([]byte, 16)
	_, _ = rand.Read(pass)
	s.pass = hex.EncodeToString(pass)
	pwfile := filepath.Join(s.dir, "pwfile")
	if err := os.WriteFile(pwfile, []byte(s.pass+"\n"), 0o600); err != nil {
		return err
	}
	defer os.Remove(pwfile)
	if err := s.chown(pwfile); err != nil {
		return err
	}
	if out, err := s.command(ctx, "initdb", "-D", filepath.Join(s.dir, "data"), "-U", "postgres", "--pwfile="+pwfile,
		"--auth-host=scram-sha-256", "--auth-local=trust", "-E", "UTF8", "--no-locale").CombinedOutput(); err != nil {
		return fmt.Errorf("initdb: %v\n%s", err, out)
	}
	return nil
}

// startPG initdb's and starts a cluster on a free port of 127.0.0.1, and
// stops and removes it at cleanup.
func startPG(t *testing.T) *pgServer {
	t.Helper()
	s := newPG(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := s.initdb(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.start(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *pgServer) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	path := filepath.Join(s.bin, name)
	if s.asRoot {
		return exec.CommandContext(ctx, "runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
	}
	return exec.CommandContext(ctx, path, args...)
}

func (s *pgServer) pgctl(ctx context.Context, args ...string) error {
	args = append([]string{"-D", filepath.Join(s.dir, "data")}, args...)
	if out, err := s.command(ctx, "pg_ctl", args...).CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
		if len(log) > 2000 {
			log = log[len(log)-2000:]
		}
		return fmt.Errorf("pg_ctl %s: %v\n%s\nserver.log ends:\n%s", strings.Join(args, " "), err, out, log)
	}
	return nil
}

func (s *pgServer) start(ctx context.Context) error {
	return s.pgctl(ctx, "-l", filepath.Join(s.dir, "server.log"), "-w", "-t", "60", "-o",
		// Unlike .ci/postgres.sh, no synchronous_commit=off: with it an
		// immediate shutdown loses commits the clients were told about, so
		// revisions are reused after the restart (a claim on the lost
		// revision N then matches a new, different revision N) and two
		// nodes can both win a term. The elections need a store that keeps
		// what it acknowledged. fsync=off is safe here: the restarts kill
		// the server, not the machine, so written WAL survives. (A
		// replicated pair turns full_page_writes back on, for pg_rewind.)
		fmt.Sprintf("-c listen_addresses=127.0.0.1 -p %d -k %s -c max_connections=300 -c fsync=off %s", s.port, s.dir, s.settings),
		"start")
}

// url returns a URL of database postgres on the given host:port pairs.
// With more than one, a client connects to the first that accepts writes
// (target_session_attrs=read-write), as a client of a replicated server
// does.
func (s *pgServer) url(hostports ...string) string {
	q := "sslmode=disable&connect_timeout=2"
	if len(hostports) > 1 {
		q += "&target_session_attrs=read-write"
	}
	u := url.URL{Scheme: "postgres", User: url.UserPassword("postgres", s.pass), Host: strings.Join(hostports, ","), Path: "/postgres",
		RawQuery: q}
	return u.String()
}

func (s *pgServer) target() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

func (s *pgServer) targets() []string { return []string{s.target()} }

func (s *pgServer) nodeURL(proxies []string) string { return s.url(proxies...) }

func (s *pgServer) name() string { return "postgres" }

// prepare creates the election table and triggers once, so that the nodes
// do not race to create them.
func (s *pgServer) prepare(ctx context.Context, election string) error {
	return pgPrepare(ctx, s.url(s.target()), election)
}

// pgPrepare creates the election table and triggers on the server at u
// (a URL or a connection string).
func pgPrepare(ctx context.Context, u, election string) error {
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		return err
	}
	defer pool.Close()
	b, err := postgres.New(pool, election, postgres.Options{})
	if err != nil {
		return err
	}
	defer b.Close()
	if err := b.Start(ctx); err != nil {
		return err
	}
	return b.Create(ctx)
}

// restart stops the server (fast and immediate shutdown in turn, the
// latter like a crash) and starts it again; it returns when the server
// accepts connections.
func (s *pgServer) restart(ctx context.Context) error {
	mode := "fast"
	if s.restarts%2 == 1 {
		mode = "immediate"
	}
	s.restarts++
	if err := s.pgctl(ctx, "-m", mode, "-w", "-t", "60", "stop"); err != nil {
		return err
	}
	return s.start(ctx)
}

// killFeeds terminates the LISTEN connections of the given nodes (the node
// program names them "lf-<id>-listen") and returns how many it ended.
func (s *pgServer) killFeeds(ctx context.Context, ids []string) (int, error) {
	return pgKillFeeds(ctx, s.url(s.target()), ids)
}

// pgKillFeeds terminates the LISTEN connections of the given nodes on the
// server at u. The harness's own connection is retried a few times: its
// connect_timeout (2 s) is the nodes' setting, and a loaded machine (busy
// loops started beside CI) missed it once; that says nothing of the nodes.
func pgKillFeeds(ctx context.Context, u string, ids []string) (int, error) {
	var conn *pgx.Conn
	var err error
	for attempt := 1; ; attempt++ {
		if conn, err = pgx.Connect(ctx, u); err == nil {
			break
		}
		if attempt == 5 {
			return 0, fmt.Errorf("the harness's connection, %d attempts: %w", attempt, err)
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("the harness's connection, %d attempts: %w", attempt, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	defer conn.Close(context.Background())
	names := make([]string, len(ids))
	for i, id := range ids {
		names[i] = "lf-" + id + "-listen"
	}
	var n int
	err = conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
		FROM pg_stat_activity WHERE application_name = ANY($1)`, names).Scan(&n)
	return n, err
}

func (s *pgServer) failover(context.Context) (int64, int64, error) { return 0, 0, errUnsupported }

var errUnsupported = errors.New("not supported on this server")
