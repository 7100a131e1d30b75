package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Many elections in one process on the memory backend (issue 43): the
// memory package's BenchmarkManyElections (memory/bench_test.go), batched,
// for each of -memory-elections, -memory-intervals heartbeat intervals of
// the default timing (1 s) each, in a go test process of its own (its
// resident memory is the benchmark's alone). Its metrics per interval:
// write statements (store calls), CPU time, failed renewals; and the
// goroutines and resident memory of the process.

// memoryRow is one size's outcome.
type memoryRow struct {
	elections int
	metrics   map[string]float64 // unit → value, as the benchmark reports them (or logs them when it fails)
	failure   string             // why the benchmark failed, if it did
}

type memoryReport struct {
	intervals int
	command   string
	rows      []memoryRow
	load0     string
	load1     string
	err       error
}

// The 10,000 elections' budget (issue 43).
const (
	memoryBudgetMiB   = 150
	memoryBudgetCPUms = 150
)

var benchLine = regexp.MustCompile(`^BenchmarkManyElections/elections=(\d+)/batched=true(?:-\d+)?\s+\d+\s+(.*)$`)

// runMemoryMany runs the benchmark and parses its output.
func runMemoryMany(ctx context.Context, cfg config) *memoryReport {
	rep := &memoryReport{intervals: cfg.memoryIntervals, load0: loadNow()}
	var sizes []string
	for _, n := range cfg.memoryElections {
		sizes = append(sizes, strconv.Itoa(n))
	}
	args := []string{"test", "-run", "^$", "-count", "1", "-timeout", "30m",
		"-bench", "^BenchmarkManyElections$/^elections=(" + strings.Join(sizes, "|") + ")$/^batched=true$",
		"-benchtime", fmt.Sprintf("%dx", cfg.memoryIntervals), ".", "-args", "-elections=" + strings.Join(sizes, ",")}
	rep.command = "cd memory && go " + strings.Join(quoteArgs(args), " ")
	logf("many elections on memory: %s (load %s)", rep.command, loadNow())
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = filepath.Join("..", "memory")
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	rep.load1 = loadNow()
	rows, failed := parseMemoryBench(out.String())
	rep.rows = rows
	if err != nil && !failed {
		tail := strings.TrimSpace(out.String())
		if len(tail) > 400 {
			tail = "..." + tail[len(tail)-400:]
		}
		rep.err = fmt.Errorf("%w: %s", err, tail)
	}
	for _, r := range rep.rows {
		if r.failure != "" {
			logf("  memory, %d elections: FAILED: %s", r.elections, r.failure)
		}
		if len(r.metrics) == 0 {
			continue
		}
		logf("  memory, %d elections: %.0f MiB resident, %.1f CPU-ms, %.2f statements per interval, %.0f goroutines, %.0f failed renewals",
			r.elections, r.metrics["rss-MiB"], r.metrics["cpu-ms/interval"], r.metrics["statements/interval"], r.metrics["goroutines"], r.metrics["renew-failures"])
	}
	if rep.err != nil {
		logf("  memory: FAILED: %v", rep.err)
	}
	return rep
}

func quoteArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if strings.ContainsAny(a, "^$|()") {
			a = "'" + a + "'"
		}
		out[i] = a
	}
	return out
}

// markdown is the memory section of results.md.
func (m *memoryReport) markdown() string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("## Many elections in one process, memory backend (issue 43)\n\n")
	p("`%s` (memory/bench_test.go): one process, one `base.Elections` on the memory backend, every election led by one node, renewals batched, default timing (heartbeat 1 s); measured over %d intervals once every election leads. Statements: calls of the store (each batch one). CPU: the process's user + system time. Resident memory: the process's RSS after a GC at the steady state. Load average %s at the start, %s at the end.\n\n", m.command, m.intervals, m.load0, m.load1)
	p("%s", m.table())
	p("\n")
	if m.err != nil {
		p("- Failed: %v.\n", m.err)
	}
	for _, r := range m.rows {
		if r.failure != "" && len(r.metrics) > 0 {
			p("- %d elections: %s.\n", r.elections, r.failure)
		}
	}
	for _, r := range m.rows {
		if r.elections == 10000 && len(r.metrics) > 0 {
			rss, cpu := r.metrics["rss-MiB"], r.metrics["cpu-ms/interval"]
			p("- Target of issue 43, 10,000 elections within %d MiB resident and %d CPU-ms per interval: %s (%.0f MiB, %.1f CPU-ms).\n",
				memoryBudgetMiB, memoryBudgetCPUms, verdict(rss <= memoryBudgetMiB && cpu <= memoryBudgetCPUms), rss, cpu)
		}
	}
	return b.String()
}

// table is the sizes' table.
func (m *memoryReport) table() string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("| elections | resident MiB | heap MiB | CPU-ms per interval | statements per interval | goroutines | failed renewals | leaders lost | renewal p99 ms |\n")
	p("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range m.rows {
		if len(r.metrics) == 0 {
			p("| %d | failed: %s | | | | | | | |\n", r.elections, r.failure)
			continue
		}
		v := r.metrics
		p("| %d | %.0f | %.0f | %.1f | %.2f | %.0f | %.0f | %.0f | %.1f |\n", r.elections, v["rss-MiB"], v["heap-MiB"], v["cpu-ms/interval"], v["statements/interval"], v["goroutines"], v["renew-failures"], v["leaders-lost"], v["renew-p99-ms"])
	}
	return b.String()
}

// parseMemoryBench reads the rows of go test's output: the metric line of
// each size that passed, the logged metrics and the failure of each that
// failed; failed says whether any did.
func parseMemoryBench(out string) (rows []memoryRow, failed bool) {
	// A failed size prints no metric line: the benchmark logs them
	// ("metrics: ...") with its failure.
	failures := map[int]*memoryRow{}
	var current int
	parseMetrics := func(row *memoryRow, text string) {
		f := strings.Fields(text)
		for i := 0; i+1 < len(f); i += 2 {
			if v, err := strconv.ParseFloat(f[i], 64); err == nil {
				row.metrics[f[i+1]] = v
			}
		}
	}
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		line := sc.Text()
		if m := benchLine.FindStringSubmatch(line); m != nil {
			n, _ := strconv.Atoi(m[1])
			row := memoryRow{elections: n, metrics: map[string]float64{}}
			parseMetrics(&row, m[2])
			rows = append(rows, row)
			continue
		}
		if _, after, ok := strings.Cut(line, "--- FAIL: BenchmarkManyElections/elections="); ok {
			current, _ = strconv.Atoi(strings.SplitN(after, "/", 2)[0])
			if failures[current] == nil {
				failures[current] = &memoryRow{elections: current, metrics: map[string]float64{}}
			}
			continue
		}
		t := strings.TrimSpace(line)
		if current == 0 || !strings.HasPrefix(t, "bench_test.go:") {
			continue
		}
		_, msg, _ := strings.Cut(t, ": ")
		switch {
		case strings.HasPrefix(msg, "metrics: "):
			parseMetrics(failures[current], strings.TrimPrefix(msg, "metrics: "))
		case strings.HasPrefix(msg, "renewals per 50 ms"), strings.HasPrefix(msg, "failed renewals by error"):
		default:
			failures[current].failure = joinNonEmpty(failures[current].failure, msg)
		}
	}
	for _, r := range failures {
		if r.failure == "" {
			r.failure = "failed"
		}
		rows = append(rows, *r)
	}
	slices.SortFunc(rows, func(a, b memoryRow) int { return a.elections - b.elections })
	return rows, len(failures) > 0
}
