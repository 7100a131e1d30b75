package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leaderfeed/leaderfeed/internal/testenv"
)

// outageFor is how long TestStoreOutage stops its server (issue 44: an
// outage of 20 s was invisible).
const outageFor = 20 * time.Second

// The store stopped for 20 s under run and watch: each says on standard
// error, at its default level, when the store is lost and when it is
// back. Without --max-outage they wait (run's CMD stopped at the end of
// its lease, run elected again once the store is back, watch printing
// the new term); with --max-outage 3s they exit 1 with one line saying
// so, as the docs say.
func TestStoreOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("skipped with -short: stops a server for 20 s")
	}
	srv := testenv.StartPostgres(t, testenv.PostgresOptions{})
	bin, _ := binaries(t)
	env := append(envWithout(storeEnv), storeEnv+"="+srv.URL("sslmode=disable"), "PGPASSWORD="+srv.Password)
	dir := t.TempDir()

	// run makes the table first (watch never does).
	mk := startEnv(t, bin, env, io.Discard, append([]string{"run", "--election", "mk"}, append(timingFlags, "--", "true")...)...)
	if code := mk.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("run making the table: exit %d\n%s", code, mk.stderr.String())
	}
	terms := map[string]string{}
	runs, watches := map[string]*proc{}, map[string]*proc{}
	watchOut := map[string]*syncBuffer{}
	for _, name := range []string{"waits", "bounded"} {
		terms[name] = filepath.Join(dir, name)
		args := []string{"run", "--election", name}
		wargs := []string{"watch", "--election", name}
		if name == "bounded" {
			args = append(args, "--max-outage", "3s")
			wargs = append(wargs, "--max-outage", "3s")
		}
		args = append(args, timingFlags...)
		args = append(args, "--", "sh", "-c", `echo "$LEADERFEED_TERM" >> "$0"; exec sleep 600`, terms[name])
		runs[name] = startEnv(t, bin, env, io.Discard, args...)
		watchOut[name] = &syncBuffer{}
		watches[name] = startEnv(t, bin, env, watchOut[name], wargs...)
	}
	for name := range runs {
		waitFor(t, 20*time.Second, name+"'s CMD and watch's first leader", func() bool {
			data, _ := os.ReadFile(terms[name])
			return len(data) > 0 && strings.Contains(watchOut[name].String(), `"leader":"`)
		})
	}

	stopped := time.Now()
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("server stopped")
	// --max-outage 3s: exit 1 within about 3 s of the last answer.
	for _, p := range []*proc{runs["bounded"], watches["bounded"]} {
		code := p.wait(t, 15*time.Second)
		took := time.Since(stopped)
		lines := strings.Split(strings.TrimSpace(p.stderr.String()), "\n")
		last := lines[len(lines)-1]
		if code != exitFailure || !strings.Contains(last, "store lost: no answer for") || !strings.Contains(last, "longer than --max-outage 3s") {
			t.Fatalf("%s with --max-outage 3s: exit %d after %v, last line %q; want exit 1 saying the store was lost\n%s",
				p.cmd.Args[1], code, took, last, p.stderr.String())
		}
		// Counted from the last answer, which may have come a heartbeat
		// (run's, or the leader's renewal watch hears of) before the stop.
		if took < 3*time.Second-2*timing.HeartbeatInterval {
			t.Fatalf("%s exited %v after the store stopped, before --max-outage 3s", p.cmd.Args[1], took)
		}
		if strings.Contains(p.stderr.String(), srv.Password) {
			t.Fatalf("the password shows:\n%s", p.stderr.String())
		}
		t.Logf("%s --max-outage 3s: exit 1 after %v: %s", p.cmd.Args[1], took.Round(time.Millisecond), last)
	}
	// Without it, a line says the store is lost, and they wait.
	for _, p := range []*proc{runs["waits"], watches["waits"]} {
		waitFor(t, 10*time.Second, p.cmd.Args[1]+"'s line that the store is lost", func() bool {
			return strings.Contains(p.stderr.String(), `level=WARN msg="leaderfeed: store lost"`)
		})
	}
	time.Sleep(time.Until(stopped.Add(outageFor)))
	for _, p := range []*proc{runs["waits"], watches["waits"]} {
		select {
		case <-p.done:
			t.Fatalf("%s exited %d during the outage, want it to wait\n%s", p.cmd.Args[1], p.cmd.ProcessState.ExitCode(), p.stderr.String())
		default:
		}
	}
	data, _ := os.ReadFile(terms["waits"])
	before := strings.Fields(string(data))
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	t.Logf("server started again after %v", back.Sub(stopped).Round(time.Millisecond))
	for _, p := range []*proc{runs["waits"], watches["waits"]} {
		waitFor(t, 15*time.Second, p.cmd.Args[1]+"'s line that the store is back", func() bool {
			return strings.Contains(p.stderr.String(), `level=WARN msg="leaderfeed: store back"`)
		})
		t.Logf("%s: store back after %v", p.cmd.Args[1], time.Since(back).Round(time.Millisecond))
	}
	// run leads again: CMD runs for a new term, which watch prints.
	var term string
	waitFor(t, 15*time.Second, "CMD started for a new term", func() bool {
		data, _ := os.ReadFile(terms["waits"])
		now := strings.Fields(string(data))
		if len(now) > len(before) {
			term = now[len(now)-1]
		}
		return term != ""
	})
	waitFor(t, 10*time.Second, "watch printing the new term", func() bool {
		return strings.Contains(watchOut["waits"].String(), `"term":`+term+`,`)
	})
	// The lines that say so, in order: lost, then back.
	for _, p := range []*proc{runs["waits"], watches["waits"]} {
		log := p.stderr.String()
		lost, backAt := strings.Index(log, `msg="leaderfeed: store lost"`), strings.Index(log, `msg="leaderfeed: store back"`)
		if lost < 0 || backAt < lost || strings.Count(log, `msg="leaderfeed: store lost"`) != 1 {
			t.Fatalf("%s: want one line that the store is lost, then one that it is back:\n%s", p.cmd.Args[1], log)
		}
		t.Logf("%s:\n%s", p.cmd.Args[1], grepLines(log, "store lost", "store back"))
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		if code := p.wait(t, 10*time.Second); code != 0 {
			t.Fatalf("%s exited %d after SIGTERM, want 0", p.cmd.Args[1], code)
		}
	}
	sc := bufio.NewScanner(strings.NewReader(watchOut["waits"].String()))
	for sc.Scan() {
		var l watchLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("watch printed %q on stdout: %v", sc.Text(), err)
		}
	}
}

// waitFor polls cond every 20 ms for up to d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v", what, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// grepLines returns the lines of s that contain any of words.
func grepLines(s string, words ...string) string {
	var b strings.Builder
	for l := range strings.Lines(s) {
		for _, w := range words {
			if strings.Contains(l, w) {
				fmt.Fprint(&b, l)
				break
			}
		}
	}
	return b.String()
}
