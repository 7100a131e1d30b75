package main

import "testing"

// TestParseMemoryBench reads a passing and a failing size of go test's
// output.
func TestParseMemoryBench(t *testing.T) {
	out := `goos: linux
BenchmarkManyElections/elections=10000/batched=true-2         	       3	         5.026 allocs/election/interval	       174.1 cpu-ms/interval	         5.000 goroutines	        136.4 rss-MiB	         2.000 statements/interval
--- FAIL: BenchmarkManyElections/elections=100000/batched=true-2
    bench_test.go:369: failed renewals by error: map[context deadline exceeded:497]
    bench_test.go:394: renewals per 50 ms: map[0:8461]
    bench_test.go:401: metrics: 1451 rss-MiB 1525 cpu-ms/interval 497 renew-failures 4573 leaders-lost
    bench_test.go:406: 4573 of 100000 elections lost their leader while nothing failed (renewals: 330595, 497 failed, latency max 239.476ms)
--- FAIL: BenchmarkManyElections
FAIL
`
	rows, failed := parseMemoryBench(out)
	if !failed || len(rows) != 2 {
		t.Fatalf("failed %v, rows %+v; want a failure and 2 rows", failed, rows)
	}
	if r := rows[0]; r.elections != 10000 || r.failure != "" || r.metrics["rss-MiB"] != 136.4 || r.metrics["cpu-ms/interval"] != 174.1 {
		t.Errorf("row 0 = %+v", r)
	}
	if r := rows[1]; r.elections != 100000 || r.metrics["leaders-lost"] != 4573 || r.metrics["rss-MiB"] != 1451 ||
		r.failure != "4573 of 100000 elections lost their leader while nothing failed (renewals: 330595, 497 failed, latency max 239.476ms)" {
		t.Errorf("row 1 = %+v", r)
	}
}
