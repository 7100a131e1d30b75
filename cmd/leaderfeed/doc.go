// Command leaderfeed is leader election from the shell, on PostgreSQL,
// MongoDB or RethinkDB: it runs a program only while it leads, shows and
// follows an election, and prints the SQL an administrator runs.
//
//	leaderfeed run    --store URL --election NAME [flags] -- CMD [ARGS...]
//	leaderfeed status --store URL --election NAME [--json]
//	leaderfeed watch  --store URL --election NAME [--max-outage D]
//	leaderfeed schema --store postgres://... [--schema S] [--table T]
//
// (--store URL, or --store-file FILE, or LEADERFEED_STORE in the
// environment: see Store URLs.)
//
// Install from a checkout: cd cmd/leaderfeed && go install . (a module of
// its own, so library users do not pull its dependencies, and `go install
// ./cmd/leaderfeed` at the root does not find it). The module is not
// published yet; once it is: go install
// github.com/leaderfeed/leaderfeed/cmd/leaderfeed@latest.
//
// # Store URLs
//
// postgres:// and postgresql:// (pgx syntax; the table public.leaderfeed,
// or --schema and --table), mongodb:// and mongodb+srv:// (a replica set;
// the database of the URL's path, default leaderfeed; --table names the
// collection), rethinkdb://[user[:password]@]host:port/database (port
// 28015 by default, database leaderfeed by default, user admin by
// default). run creates what is missing unless --no-create is given;
// status and watch never create anything (an observer needs no right to
// change the database) and take neither --no-create nor the timing flags.
//
// Every command takes the URL from --store, from the first line of the
// file --store-file names, or from the environment variable
// LEADERFEED_STORE, in that order. An argument is shown to every user of
// the host (ps, /proc/PID/cmdline) and kept in shell history, so a URL
// with a password in --store gets a one-line warning on standard error;
// give it by LEADERFEED_STORE or --store-file (a file only its user may
// read: one that others may read gets the same warning), or leave the
// password out of the URL. For PostgreSQL the
// password (and any other part of the connection) may come from libpq's
// variables, which pgx reads: PGPASSWORD, PGPASSFILE or ~/.pgpass (lines
// host:port:database:user:password, the file readable by its owner
// only), PGHOST, PGUSER, PGSSLMODE, PGSSLROOTCERT and the others of
// libpq's documentation. A CMD of run inherits leaderfeed's environment,
// LEADERFEED_STORE included.
//
// TLS, for each scheme, checking the server's certificate:
//
//	postgres://app@db/app?sslmode=verify-full&sslrootcert=/etc/ssl/db-ca.pem
//	mongodb://app@db1,db2/app?replicaSet=rs0&tls=true&tlsCAFile=/etc/ssl/db-ca.pem
//	rethinkdb://app@db:28015/app?tls=true&tlsCAFile=/etc/ssl/db-ca.pem
//
// (sslmode=verify-full checks the host name too; without sslrootcert,
// pgx takes ~/.postgresql/root.crt if it exists, else the system's
// roots, as sslrootcert=system does. MongoDB's driver takes the tls*
// parameters of its documentation. For rethinkdb:// the parameters are
// tls=true, which checks the certificate against the system's roots, and
// tlsCAFile, which implies it; any other parameter is a usage error.)
//
// --connect-timeout (default 10s) bounds how long each command waits for
// the store at start, from the connection to the last check of the table:
// a refused connection, a name that does not resolve, a server still
// starting are retried as the library's Feed.Start retries them (the
// first retry within 200 ms, then at most 500 ms apart, so a store that
// comes up is in use within a second), each wait logged on standard error
// at Warn ("leaderfeed: store not reached, waiting", then now and then a
// line while it goes on). When the timeout ends first the command exits
// with code 3 and one line giving the store's last error. A refusal is
// not retried (exit code 4, below).
//
// # When the store is lost
//
// run and watch say on standard error, at Warn (shown at the default log
// level of both), when the store is lost and when it is back:
//
//	level=WARN msg="leaderfeed: store lost" silent_for=1.502s err="... connect: connection refused"
//	level=WARN msg="leaderfeed: store back" lost_for=20.291s
//
// The store is lost when its calls fail (the changefeed is down, reads
// or renewals fail) and it has not answered anything for LeaseDuration;
// it is back at its first answer. Meanwhile they wait, however long: run
// stops CMD at the end of its lease (as for any lost leadership), keeps
// campaigning, and is elected again once the store is back (each term
// runs CMD anew); watch prints the leader it then finds. With
// --max-outage D they give up instead once the store has not answered
// for D: run stops CMD, and each exits with code 1 and one line ("store
// lost: no answer for ..., longer than --max-outage D; last error: ...").
//
// # When the store refuses
//
// A store that answers but refuses is not a store that cannot be reached:
// retrying cannot fix it, so every command exits at once with code 4 and
// one line naming the cause and the fix. run does so also when the
// refusal comes while it runs (a GRANT revoked). The lines, on
// PostgreSQL 15, for a role "app" and the table public.leaderfeed:
//
//   - no privilege on the table: `election table "public"."leaderfeed"
//     exists, but this role has no SELECT privilege on it ... fix: GRANT
//     USAGE ON SCHEMA "public" TO "app"; GRANT SELECT, INSERT, UPDATE,
//     DELETE ON "public"."leaderfeed" TO "app"`;
//   - SELECT only (run's first presence write; with --no-participate its
//     first claim, `claim term 1: ...`): `postgres: Present: ... ERROR:
//     permission denied for table leaderfeed (SQLSTATE 42501); fix: GRANT
//     ...`;
//   - no table, with --no-create: `election table "public"."leaderfeed"
//     does not exist and --no-create is given ... fix: apply the output of
//     `leaderfeed schema` as a role that may create tables, or run without
//     --no-create, which creates it`; from status and watch: `... does not
//     exist and watch never creates it ... fix: apply the output of
//     `leaderfeed schema` ..., or let `leaderfeed run` (without
//     --no-create) create it`;
//   - a wrong password (SQLSTATE 28P01), a missing database (3D000): the
//     server's words and the fix.
//
// MongoDB's Unauthorized (13) and AuthenticationFailed (18), RethinkDB's
// permission errors, wrong credentials and missing databases or tables
// are sorted the same way.
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
//     Resigning hands the election over in one write (see Handover).
//   - On Linux CMD's whole process group gets SIGKILL when leaderfeed dies,
//     kill -9 included: CMD runs under a small guard (leaderfeed itself,
//     shown by ps as "leaderfeed __guard PATH ARGV...", the leader of the
//     group) that holds one end of a pipe whose other end only leaderfeed
//     holds; when the kernel closes it, the guard kills the group, so
//     processes that CMD started die too unless they left its process
//     group (setsid, setpgid). The guard passes signals to the group
//     through to CMD and exits with CMD's status. Elsewhere CMD is
//     leaderfeed's own child and survives a kill -9 of leaderfeed.
//
// What is guaranteed: at most one leaderfeed of an election leads at any
// instant, and each stops its CMD (SIGTERM) no later than the end of its
// lease. What is not: that CMD has exited when the next CMD starts, if it
// ignores SIGTERM for longer than the margin (ElectionTimeoutMin minus
// LeaseDuration) or leaderfeed is frozen: CMD should pass LEADERFEED_TERM
// to what it writes, so that a resource can refuse a deposed leader.
//
// On PostgreSQL the refusal can be exact: run creates (and schema prints)
// the function TABLE_fence(election, term) beside the election table, and
// a transaction of CMD that calls it with $LEADERFEED_ELECTION and
// $LEADERFEED_TERM commits before the next term begins, or fails with
// SQLSTATE LF001 and commits nothing (docs/OPERATING.md shows it with
// psql).
//
// # Handover
//
// run participates (base.Options.Participate): it keeps a presence record
// in the election table beside the election's record, refreshed every
// quarter of the lease, and deleted when it stops. When it resigns
// (SIGINT, SIGTERM, CMD exited), it reads the participants afresh and
// writes one record that names the successor leader of the next term: the
// live participant of the highest --priority, then the one that joined
// last (started most recently), then the lowest --id. When it stops
// (SIGINT, SIGTERM, CMD exited without --restart) it withdraws its own
// record first, in the same round trip as that read. The successor starts
// its CMD from that record, without a claim of its own. So a rolling
// restart (start a new node, wait until it has started ("leaderfeed:
// started" in its log), SIGTERM an old one, oldest first) moves leadership
// once, to a new node, and never to a node that has left. --priority N (in
// [-100, 100], default 0) prefers nodes: a leader that sees a live node of
// higher priority for a while hands over to it; a negative priority makes
// a canary lead only when nothing else can. --no-participate writes no
// presence record: resigning then writes a vacant record that any node
// claims at once, and --priority is refused with it (exit code 2). Every
// store of run keeps presence records.
//
// --health ADDR serves /healthz: 200 and "ok", or 503 and the reason when
// the election is wedged or the store refuses (see base.Feed.Healthy;
// --health-bound sets how long). The log lines about CMD ("leaderfeed:
// CMD started", "leaderfeed: stopping CMD", the SIGKILL after --grace)
// give CMD's own pid, and as group the pid of its process group's leader
// (the guard on Linux), which is what gets the signals. When the store
// refuses while run leads, the line that ends the term ("leaderfeed:
// unelected ... reason=stopped") carries the refusal as err. --metrics ADDR serves /metrics for Prometheus (see docs/METRICS.md
// for the instruments and an example).
//
// # Timing
//
// --heartbeat, --election-timeout-min, --election-timeout-max, --lease and
// --vacancy-jitter set heartbeat.Timing (zero: the library's defaults, 1s
// and 2s..4s); --failover D derives all of them from the longest acceptable
// failover after a crash (heartbeat.TimingFor). Nodes of one election may
// use different timings (a rolling change): every record carries its
// writer's lease, and no node claims before that lease has ended.
// Impossible combinations are refused with exit code 2, naming the flags
// and saying which values are defaults: `run --heartbeat 5s` says
// "--election-timeout-min (2s, the default) must be greater than
// --heartbeat (5s)".
//
// # Exit codes
//
// One code per cause, the same in every command:
//
//	0    success; run, watch: stopped by SIGINT or SIGTERM
//	1    a failure while running: run, watch: the store lost for longer
//	     than --max-outage (without it they wait); status: a read that
//	     failed
//	2    usage: a bad flag (or one the command does not take), a
//	     malformed or unsupported store URL, a missing --, an election
//	     name or timing the library refuses, a taken --health or
//	     --metrics address
//	3    the store could not be reached within --connect-timeout
//	4    the store refuses: a missing privilege, a wrong password, a
//	     missing database or table, a table of another shape, a server
//	     without a capability leaderfeed needs (MongoDB without a
//	     replica set)
//	126  CMD is not executable
//	127  CMD was not found
//	N    run without --restart: CMD's own status when it exited by itself
//
// Every error is one line on standard error, naming what is wrong (the
// last line, after any log lines); nothing is left running.
package main
