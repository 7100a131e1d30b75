package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/leaderfeed/leaderfeed/internal/testenv"
)

// envWithout returns this process's environment without the variables
// named, and without those of libpq (PG*), which pgx reads too.
func envWithout(names ...string) []string {
	return slices.DeleteFunc(os.Environ(), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return slices.Contains(names, k) || strings.HasPrefix(k, "PG")
	})
}

// A password given in --store is shown to every user of the host: one
// warning line says so and how to avoid it, and the password appears in
// no line.
func TestArgvPasswordWarning(t *testing.T) {
	bin, _ := binaries(t)
	const secret = "s3cr3t-in-argv"
	for _, args := range [][]string{
		{"status", "--store", "postgres://app:" + secret + "@127.0.0.1:1/db", "--election", "e", "--connect-timeout", "300ms"},
		{"status", "--store", "postgres://app@127.0.0.1:1/db?password=" + secret, "--election", "e", "--connect-timeout", "300ms"},
		{"schema", "--store", "postgres://app:" + secret + "@h/db"},
		{"status", "--store", "app:" + secret + "@127.0.0.1:1/db", "--election", "e"}, // no scheme
	} {
		cmd := exec.Command(bin, args...)
		cmd.Env = envWithout(storeEnv)
		out, _ := cmd.CombinedOutput()
		if n := strings.Count(string(out), "the password in --store is shown to every user of this host"); n != 1 && strings.Contains(args[2], "://") {
			t.Errorf("%v: %d warnings, want 1:\n%s", args, n, out)
		}
		if strings.Contains(string(out), secret) {
			t.Errorf("%v: the password shows in the output:\n%s", args, out)
		}
	}
	// A password in a file others may read: one warning naming the file
	// and the fix; none when only its owner may, or without a password.
	for _, tc := range []struct {
		mode  os.FileMode
		store string
		warn  bool
	}{
		{0o644, "postgres://app:" + secret + "@h/db", true},
		{0o640, "postgres://app@h/db?password=" + secret, true},
		{0o600, "postgres://app:" + secret + "@h/db", false},
		{0o644, "postgres://app@h/db", false},
	} {
		f := writeTemp(t, tc.store+"\n")
		if err := os.Chmod(f, tc.mode); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "schema", "--store-file", f)
		cmd.Env = envWithout(storeEnv)
		out, _ := cmd.CombinedOutput()
		n := strings.Count(string(out), "the password in --store-file is readable by users other than its owner")
		if want := map[bool]int{true: 1, false: 0}[tc.warn]; n != want || (tc.warn && !strings.Contains(string(out), "chmod 600 "+f)) {
			t.Errorf("--store-file of mode %04o holding %q: %d warnings, want %d with the fix:\n%s", tc.mode, strings.ReplaceAll(tc.store, secret, "***"), n, want, out)
		}
		if strings.Contains(string(out), secret) {
			t.Errorf("--store-file of mode %04o: the password shows in the output:\n%s", tc.mode, out)
		}
	}
	// No password in --store: no warning.
	cmd := exec.Command(bin, "schema", "--store", "postgres://app@h/db")
	cmd.Env = envWithout(storeEnv)
	if out, _ := cmd.CombinedOutput(); strings.Contains(string(out), "WARN") {
		t.Errorf("a URL without a password got a warning:\n%s", out)
	}
}

// As docs/OPERATING.md recommends: the store named in LEADERFEED_STORE
// (or --store-file), the password in a password file (or PGPASSWORD),
// TLS checked against the server's certificate. ps shows no password for
// run, its guard or CMD; status reaches the same server every way; a
// client without TLS is refused by this server (exit 4).
func TestStoreOverTLSWithoutSecrets(t *testing.T) {
	srv := testenv.StartPostgres(t, testenv.PostgresOptions{TLS: true})
	bin, _ := binaries(t)
	dir := t.TempDir()
	passfile := filepath.Join(dir, "pgpass")
	if err := os.WriteFile(passfile, fmt.Appendf(nil, "127.0.0.1:%d:*:postgres:%s\n", srv.Port, srv.Password), 0o600); err != nil {
		t.Fatal(err)
	}
	url := srv.URL("sslmode=verify-full&sslrootcert=" + neturl.QueryEscape(srv.CAFile))
	env := append(envWithout(storeEnv), storeEnv+"="+url, "PGPASSFILE="+passfile)

	election := uniqueName("tls")
	p := startEnv(t, bin, env, io.Discard, append([]string{"run", "--election", election}, append(timingFlags, "--", "sleep", "60")...)...)
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, err := statusWith(bin, env, "--election", election)
		if err == nil && st.Leader != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no leader over TLS after 20 s: %+v, %v\n%s", st, err, p.stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	// ps reads /proc/PID/cmdline: no process of the machine shows it.
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	seen := 0
	for _, f := range procs {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		args := strings.ReplaceAll(string(data), "\x00", " ")
		if strings.Contains(args, srv.Password) {
			t.Errorf("%s shows the password: %q", f, args)
		}
		if strings.HasPrefix(args, bin+" run") || strings.HasPrefix(args, "leaderfeed __guard") || strings.HasPrefix(args, "sleep 60") {
			seen++
		}
	}
	if seen < 2 {
		t.Fatalf("found %d of leaderfeed run, its guard and CMD in /proc", seen)
	}
	if strings.Contains(p.stderr.String(), "WARN") {
		t.Errorf("run warned:\n%s", p.stderr.String())
	}

	// status: --store-file with PGPASSWORD, over TLS.
	storeFile := filepath.Join(dir, "store")
	if err := os.WriteFile(storeFile, []byte(url+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if st, err := statusWith(bin, append(envWithout(storeEnv), "PGPASSWORD="+srv.Password), "--store-file", storeFile, "--election", election); err != nil || st.Leader == "" {
		t.Fatalf("status --store-file with PGPASSWORD: %+v, %v", st, err)
	}
	// Without TLS this server refuses the connection (hostssl only).
	cmd := exec.Command(bin, "status", "--election", election, "--connect-timeout", "5s")
	cmd.Env = append(envWithout(storeEnv), storeEnv+"="+srv.URL("sslmode=disable"), "PGPASSWORD="+srv.Password)
	out, err := cmd.CombinedOutput()
	if code := exitCode(err); code != exitRefused || !strings.Contains(string(out), "no encryption") {
		t.Fatalf("status without TLS: exit %d, want %d naming the missing encryption:\n%s", code, exitRefused, out)
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.wait(t, 10*time.Second); code != 0 {
		t.Fatalf("run exited %d after SIGTERM, want 0\n%s", code, p.stderr.String())
	}
}

// statusWith runs leaderfeed status --json with env and args.
func statusWith(bin string, env []string, args ...string) (statusJSON, error) {
	cmd := exec.Command(bin, append([]string{"status", "--json", "--connect-timeout", "5s"}, args...)...)
	cmd.Env = env
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var s statusJSON
	if err != nil {
		return s, fmt.Errorf("%v: %s", err, stderr.String())
	}
	return s, json.Unmarshal(out, &s)
}

func exitCode(err error) int {
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// A store that is not up is retried without the driver's leak: each
// failed rethinkdb-go Connect leaves a goroutine behind, so the command
// connects over TCP first.
func TestRethinkRetryLeaksNothing(t *testing.T) {
	u, err := parseStore("rethinkdb://127.0.0.1:1/db")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for range 20 {
		if st, err := u.open(ctx, storeOptions{}); err == nil {
			st.close()
			t.Fatal("connected to port 1")
		}
	}
	goleak.VerifyNone(t)
}

// The user and password of a rethinkdb:// URL are used: reqlite takes
// only user admin without a password, so a password is refused (exit 4)
// where it was ignored before.
func TestRethinkCredentials(t *testing.T) {
	addr := os.Getenv("LEADERFEED_RETHINK_ADDR")
	if addr == "" {
		testenv.Unavailable(t, "LEADERFEED_RETHINK_ADDR is not set (source .ci/rethink.sh)")
	}
	bin, _ := binaries(t)
	for _, tc := range []struct {
		store string
		code  int
	}{
		{"rethinkdb://admin:wrong-password@" + addr + "/lf_cmd_creds", exitRefused}, // a password reqlite does not have
		{"rethinkdb://admin@" + addr + "/lf_cmd_creds", exitOK},
	} {
		// run makes the database and table, then CMD exits 0.
		cmd := exec.Command(bin, append([]string{"run", "--store-file", writeTemp(t, tc.store), "--election", "e"}, append(timingFlags, "--", "true")...)...)
		cmd.Env = envWithout(storeEnv)
		out, err := cmd.CombinedOutput()
		if code := exitCode(err); code != tc.code {
			t.Fatalf("%s: exit %d, want %d:\n%s", redact(tc.store), code, tc.code, out)
		}
		if strings.Contains(string(out), "wrong-password") {
			t.Fatalf("the password shows:\n%s", out)
		}
	}
}

func writeTemp(t *testing.T, content string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(f, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}
