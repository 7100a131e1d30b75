package testenv

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"
)

// Postgres is a PostgreSQL cluster of a test's own, made with the server
// binaries .ci/postgres.sh uses (Debian's layout, or initdb and pg_ctl on
// PATH), so that the test can stop it, or serve it over TLS, without
// disturbing the server other tests use. It listens on a free port of
// 127.0.0.1; user postgres has the random Password over TCP
// (scram-sha-256).
type Postgres struct {
	// Port is the server's TCP port on 127.0.0.1.
	Port int
	// Password is user postgres's password.
	Password string
	// CAFile is, with TLS, the PEM file of the server's self-signed
	// certificate (for 127.0.0.1 and localhost), for sslrootcert.
	CAFile string

	bin, dir string
	asRoot   bool // the server runs as user postgres, through runuser
	uid, gid int
	settings string
}

// PostgresOptions say how StartPostgres makes its server.
type PostgresOptions struct {
	// TLS turns ssl on with a certificate made at start and accepts TCP
	// connections over TLS only (hostssl), so that a client that does not
	// use TLS is refused.
	TLS bool
}

// StartPostgres initdb's and starts a private server, and stops it and
// removes its directory at cleanup. Without the server binaries it calls
// Unavailable.
func StartPostgres(t testing.TB, opts PostgresOptions) *Postgres {
	t.Helper()
	s := &Postgres{asRoot: os.Geteuid() == 0}
	var ok bool
	if s.bin, ok = postgresBin(); !ok {
		Unavailable(t, "no PostgreSQL server binaries (initdb, pg_ctl): install Debian's postgresql package")
	}
	if s.asRoot {
		u, err := user.Lookup("postgres")
		if err != nil {
			Unavailable(t, "running as root but there is no user postgres to run the server")
		}
		s.uid, _ = strconv.Atoi(u.Uid)
		s.gid, _ = strconv.Atoi(u.Gid)
	}
	dir, err := os.MkdirTemp("", "leaderfeed-pg-")
	if err != nil {
		t.Fatal(err)
	}
	s.dir = dir
	t.Cleanup(func() {
		_ = s.pgctl("-m", "immediate", "-w", "-t", "30", "stop")
		_ = os.RemoveAll(dir)
	})
	if err := s.chown(dir); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.Port = ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	pass := make([]byte, 16)
	_, _ = rand.Read(pass)
	s.Password = hex.EncodeToString(pass)
	pwfile := filepath.Join(dir, "pwfile")
	if err := s.write(pwfile, []byte(s.Password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	if out, err := s.command(context.Background(), "initdb", "-D", data, "-U", "postgres", "--pwfile="+pwfile,
		"--auth-host=scram-sha-256", "--auth-local=trust", "-E", "UTF8", "--no-locale", "--no-sync").CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	_ = os.Remove(pwfile)
	s.settings = fmt.Sprintf("-c listen_addresses=127.0.0.1 -p %d -k %s -c fsync=off", s.Port, dir)
	if opts.TLS {
		if err := s.makeTLS(data); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	return s
}

// URL returns a URL of database postgres as user postgres, without the
// password (give it by PGPASSWORD, a password file, or add it), with
// query (for example "sslmode=disable").
func (s *Postgres) URL(query string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?%s", s.Port, query)
}

// Start starts the server (again) and waits until it takes connections.
func (s *Postgres) Start() error {
	return s.pgctl("-l", filepath.Join(s.dir, "server.log"), "-w", "-t", "60", "-o", s.settings, "start")
}

// Stop stops the server (fast shutdown: clients are disconnected).
func (s *Postgres) Stop() error {
	return s.pgctl("-m", "fast", "-w", "-t", "60", "stop")
}

func postgresBin() (string, bool) {
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

func (s *Postgres) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	path := filepath.Join(s.bin, name)
	if s.asRoot {
		return exec.CommandContext(ctx, "runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
	}
	return exec.CommandContext(ctx, path, args...)
}

func (s *Postgres) pgctl(args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := s.command(ctx, "pg_ctl", append([]string{"-D", filepath.Join(s.dir, "data")}, args...)...)
	// The server's output goes to its log file: a pipe here would be
	// held open by the server.
	cmd.WaitDelay = time.Second
	if out, err := cmd.CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
		return fmt.Errorf("pg_ctl %v: %v\n%s\nserver.log:\n%s", args, err, out, log)
	}
	return nil
}

// chown gives p to the server's user, when the tests run as root.
func (s *Postgres) chown(p string) error {
	if !s.asRoot {
		return nil
	}
	return os.Chown(p, s.uid, s.gid)
}

// write writes a file the server's user owns.
func (s *Postgres) write(p string, data []byte, mode os.FileMode) error {
	if err := os.WriteFile(p, data, mode); err != nil {
		return err
	}
	return s.chown(p)
}

// makeTLS makes a self-signed certificate for 127.0.0.1 and localhost,
// turns ssl on with it, and lets TCP clients in over TLS only.
func (s *Postgres) makeTLS(data string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "leaderfeed test server"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	crt, keyFile := filepath.Join(data, "server.crt"), filepath.Join(data, "server.key")
	s.CAFile = filepath.Join(s.dir, "ca.crt")
	if err := s.write(crt, certPEM, 0o644); err != nil {
		return err
	}
	if err := s.write(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(s.CAFile, certPEM, 0o644); err != nil {
		return err
	}
	hba := "local all all trust\nhostssl all all 127.0.0.1/32 scram-sha-256\n"
	if err := s.write(filepath.Join(data, "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		return err
	}
	s.settings += " -c ssl=on -c ssl_cert_file=" + crt + " -c ssl_key_file=" + keyFile
	return nil
}
