// Command leaderfeed is leader election from the shell, on PostgreSQL,
// MongoDB or RethinkDB: it runs a program only while it leads, shows and
// follows an election, and prints the SQL an administrator runs.
//
//	leaderfeed run    --store URL --election NAME [flags] -- CMD [ARGS...]
//	leaderfeed status --store URL --election NAME [--json]
//	leaderfeed watch  --store URL --election NAME
//	leaderfeed schema --store postgres://... [--schema S] [--table T]
//
// Install: go install github.com/leaderfeed/leaderfeed/cmd/leaderfeed@latest
// (a module of its own: library users do not pull its dependencies).
//
// # Store URLs
//
// postgres:// and postgresql:// (pgx syntax; the table public.leaderfeed,
// or --schema and --table), mongodb:// and mongodb+srv:// (a replica set;
// the database of the URL's path, default leaderfeed; --table names the
// collection), rethinkdb://host:port/database (port 28015 by default,
// database leaderfeed by default). What is missing is created unless
// --no-create is given.
//
// # run
//
// run campaigns in the election. Each time it is elected it starts CMD
// with LEADERFEED_TERM (the term: a fencing token, strictly increasing
// each time leadership is won), LEADERFEED_ELECTION and LEADERFEED_NODE in
// its environment, and its standard input, output and error passed through
// unchanged. CMD runs in a process group of its own.
//
//   - When leadership ends (deposed, lease expired), the group gets SIGTERM
//     at once, when this node's lease ends or before, and SIGKILL after
//     --grace (default 10s). leaderfeed then campaigns again.
//   - When CMD exits by itself, what it left in its group gets SIGKILL,
//     leaderfeed resigns (another node takes over in milliseconds) and
//     exits with CMD's status (128+N if a signal N killed it); with
//     --restart it campaigns again instead, and runs CMD anew for each term
//     it wins (not at once: it lets the others take the vacancy first).
//   - On SIGINT or SIGTERM it stops CMD the same way, resigns and exits 0.
//   - On Linux CMD gets SIGKILL from the kernel when leaderfeed dies, kill
//     -9 included (a parent-death signal, bound to a thread that lives as
//     long as leaderfeed). Processes that CMD started are not covered by
//     that signal: have CMD exec its program, or set their own.
//
// What is guaranteed: at most one leaderfeed of an election leads at any
// instant, and each stops its CMD (SIGTERM) no later than the end of its
// lease. What is not: that CMD has exited when the next CMD starts, if it
// ignores SIGTERM for longer than the margin (ElectionTimeoutMin minus
// LeaseDuration) or leaderfeed is frozen: CMD should pass LEADERFEED_TERM
// to what it writes, so that a resource can refuse a deposed leader.
//
// --health ADDR serves /healthz: 200 and "ok", or 503 and the reason when
// the election is wedged (see base.Feed.Healthy; --health-bound sets how
// long). --metrics ADDR serves /metrics for Prometheus (see docs/METRICS.md
// for the instruments and an example).
//
// # Timing
//
// --heartbeat, --election-timeout-min, --election-timeout-max, --lease and
// --vacancy-jitter set heartbeat.Timing (zero: the library's defaults, 1s
// and 2s..4s); --failover D derives all of them from the longest acceptable
// failover after a crash (heartbeat.TimingFor). Nodes of one election may
// use different timings (a rolling change): every record carries its
// writer's lease, and no node claims before that lease has ended. Impossible combinations are refused with exit
// code 2, naming the fields.
//
// # Exit codes
//
//	0    success; run: stopped by SIGINT or SIGTERM
//	1    a failure while running (the store lost, a read that failed)
//	2    usage: a bad flag, a malformed or unsupported store URL, a missing
//	     --, an election name or timing the library refuses, a taken --health
//	     or --metrics address
//	3    the store could not be reached or refused to serve at start
//	126  CMD is not executable
//	127  CMD was not found
//	N    run without --restart: CMD's own status when it exited by itself
//
// Every error is one line on standard error, naming what is wrong; nothing
// is left running.
package main
