//go:build linux

package integration

import (
	"bytes"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// loadEvery is how often a loadSampler looks at the machine.
const loadEvery = 20 * time.Millisecond

// loadSampler measures the load a run actually meets, so that each
// fault's liveness bound follows it (Fault.Bound). The timing scale
// (basetest.ScaleEnv) is measured once, before the tests; a machine that
// gets busier later starves the nodes of CPU, and a leader comes later
// than the bound though nothing is wrong. Every loadEvery it reads how
// many tasks are runnable (procs_running in /proc/stat, less itself):
// with n of them on c cores each gets about c/n of a core, so the nodes
// run n/c times slower than on an idle machine.
type loadSampler struct {
	mu   sync.Mutex
	at   []int64 // Monotonic
	n    []int   // runnable tasks but the sampler
	stop chan struct{}
	done chan struct{}
}

// startLoadSampler starts sampling until stop is called. Without
// /proc/stat it samples nothing, and slowdown is always 1.
func startLoadSampler() *loadSampler {
	s := &loadSampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(loadEvery)
		defer tick.Stop()
		for {
			if n, ok := runnable(); ok {
				s.mu.Lock()
				s.at, s.n = append(s.at, Monotonic()), append(s.n, n)
				s.mu.Unlock()
			}
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

func (s *loadSampler) close() {
	close(s.stop)
	<-s.done
}

// runnable returns procs_running of /proc/stat less the caller.
func runnable() (int, bool) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, false
	}
	_, rest, ok := bytes.Cut(data, []byte("\nprocs_running "))
	if !ok {
		return 0, false
	}
	line, _, _ := bytes.Cut(rest, []byte("\n"))
	n, err := strconv.Atoi(string(line))
	if err != nil {
		return 0, false
	}
	return max(0, n-1), true
}

// slowdown returns how many times slower than on an idle machine the
// nodes ran between from and to (Monotonic): the mean of the runnable
// tasks sampled then, per core, and at least 1.
func (s *loadSampler) slowdown(from, to int64) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	sum, k := 0, 0
	for i, at := range s.at {
		if at >= from && at <= to {
			sum += s.n[i]
			k++
		}
	}
	if k == 0 {
		return 1
	}
	return max(1, float64(sum)/float64(k)/float64(runtime.NumCPU()))
}

// stretch sets each fault's Bound to bound times the slowdown measured
// from the fault to the end of its bound, so stretched: a leader must
// come within the time an idle machine needs, at the pace the nodes
// actually ran.
func (s *loadSampler) stretch(faults []Fault, bound time.Duration) {
	for i, f := range faults {
		from := f.At
		if !f.NewLeader && f.Ref > from {
			from = f.Ref
		}
		// The window grows with the bound; two rounds settle it.
		b := bound
		for range 2 {
			b = time.Duration(float64(bound) * s.slowdown(from, from+int64(b)))
		}
		faults[i].Bound = b
	}
}

// A fault's Bound, stretched by the load measured during it, takes a late
// leader for a starved machine, shown and not failed; beyond it the
// leader is late, and safety is checked as before.
func TestCheckStretchedBound(t *testing.T) {
	logs := []NodeLog{
		{Proc: "n1#1", End: 1000 * ms, Lines: []Line{el(100, 1), act(1, 101, 190), un(200, 1, "lease-expired")}},
		{Proc: "n2#1", End: 1000 * ms, Lines: []Line{el(450, 2), act(2, 451, 600), un(600, 2, "stopped")}},
	}
	bound := 250 * time.Millisecond
	for _, tc := range []struct {
		stretched time.Duration
		starved   int
		late      string
	}{
		{0, 0, "a leader only after 300ms (bound 250ms)"},
		{350 * time.Millisecond, 1, ""},
		{280 * time.Millisecond, 0, "a leader only after 300ms (bound 250ms, 280ms for the load measured during the fault)"},
	} {
		r := Check(logs, []Fault{{Kind: "kill", Seq: 1, Victim: "n1#1", At: 150 * ms, NewLeader: true, Bound: tc.stretched}}, bound)
		if len(r.Starved) != tc.starved {
			t.Errorf("bound %v: starved %q, want %d", tc.stretched, r.Starved, tc.starved)
		}
		err := r.Err()
		if (tc.late == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.late) {
			t.Errorf("bound %v: %v, want %q", tc.stretched, err, tc.late)
		}
	}
}

// The sampler reads the machine's runnable tasks, and a slowdown is
// never under 1.
func TestLoadSampler(t *testing.T) {
	s := startLoadSampler()
	from := Monotonic()
	time.Sleep(5 * loadEvery)
	s.close()
	if d := s.slowdown(from, Monotonic()); d < 1 {
		t.Fatalf("slowdown %v, want at least 1", d)
	}
	if d := s.slowdown(0, 1); d != 1 {
		t.Fatalf("slowdown without samples %v, want 1", d)
	}
	faults := []Fault{{At: from, NewLeader: true}}
	s.stretch(faults, time.Second)
	if faults[0].Bound < time.Second {
		t.Fatalf("stretched bound %v, want at least the bound", faults[0].Bound)
	}
	t.Logf("slowdown now %.2f", s.slowdown(from, Monotonic()))
}
