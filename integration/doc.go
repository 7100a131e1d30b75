// Package integration tests leaderfeed across separate processes, against
// real database servers, while faults are injected: it is the evidence for
// "never two leaders at once".
//
// The tests (go test ./integration/) build the node program in ./node, start
// N copies of it (default 5) as separate OS processes, each on its own
// Proxy in front of the server, and inject faults one after another:
//
//   - kill: SIGKILL the leader (a new process takes its place);
//   - stop: SIGSTOP the leader for longer than its lease, then SIGCONT; it
//     must find that it lost leadership and must not act as leader after
//     its lease ended;
//   - cut: cut the leader off the server at its Proxy, then heal;
//   - feedkill: terminate only the changefeed connection of the leader and
//     of one follower (PostgreSQL: pg_terminate_backend of the listener);
//   - restart: restart the database server;
//   - failover: on a replicated PostgreSQL, kill -9 every process of the
//     primary, promote the standby and bring the old primary back as the
//     new standby (pg_rewind).
//
// Every node prints each transition, stamped with the system's monotonic
// clock (see Monotonic), which every process on the machine shares; the
// Checker reads all of those logs and verifies that no two leadership
// intervals overlap, that terms strictly increase from one leader to the
// next, that a node's leader context is never found live outside its
// leadership interval, and that after every fault a leader exists within
// the bound. A killed node's leadership ends when it was killed (the
// harness notes the moment kill(2) returned), not when its exit is
// noticed, which on a loaded machine can be much later.
//
// In TestFaultsPostgres the leader also runs fenced transactions all along
// (postgres.Fence, then a write to a table of the tests'; half of them
// check the leader context only as they begin and hold their lock a few
// milliseconds, so that a pause can fall inside them), and the database
// itself counts the ones that committed after a newer term's claim,
// handover or vacancy had (FenceSchemaSQL: a trigger on the election table
// and a head row that both update, in commit order). The run reports
// commits, refusals (base.ErrFenced) and stale commits by kind of fault
// and fails on any stale commit.
//
// On PostgreSQL the tests start a private server (initdb into a temporary
// directory) so that they can restart it; they need the server binaries
// (Debian's postgresql package) and fail in CI (CI=true) without them.
// TestFaultsPostgresFailover runs the nodes against a primary with a
// synchronous standby (synchronous_standby_names='*', synchronous_commit=on)
// made with pg_basebackup, both private clusters, through one proxy per
// server and a multi-host URL (target_session_attrs=read-write), and fails
// the primary over 10 times; every rule must hold. With asynchronous
// replication a failover can lose writes the old primary acknowledged, so
// TestFaultsPostgresFailoverAsync runs only with LEADERFEED_PG_ASYNC=1 and
// reports what it finds without failing.
//
// Against MongoDB and RethinkDB they run, with the faults that need no
// control of the server (kill, stop, cut), when a real server is given
// (LEADERFEED_MONGO_URL; LEADERFEED_RETHINK_ADDR unless
// LEADERFEED_RETHINK_REQLITE=1) or Docker can start one, and are skipped
// otherwise: the in-process (lungo) and non-atomic (reqlite) stand-ins the
// other packages use cannot serve here. A given server that cannot be used
// fails the test in CI.
//
// TestStartWaitsForPostgres starts a Feed while its PostgreSQL address
// refuses connections and opens a Proxy there 5 s later (2 s with -short):
// it must lead within a second of that (times LEADERFEED_TEST_SCALE). It
// uses LEADERFEED_POSTGRES_URL when given, else a private server.
//
// TestREADMEPrograms runs the two programs of README.md as users copy
// them (taken from its code blocks and built with this checkout): three
// copies of each on one machine, with distinct node ids as the README has
// them and with one shared id, 20 SIGTERMs and 5 SIGKILLs of the leader
// each (5 and 2 with -short). It checks the copies' own logs for
// overlapping jobs and the store's history of writes for leader changes
// per fault, and that a shared id is logged and a distinct one is not.
//
// TestRolloutPostgres and TestShrinkPostgres are deploys (issue 41): five
// nodes that participate, with the library's default timing, stopped by
// SIGTERM. A rollout starts a new node, waits until it participates, then
// stops the oldest old one, until all five are new: leadership must move
// exactly once per rollout (20 rollouts, 5 with -short). A shrink stops
// nodes one at a time, no new one started between, from five to one (6
// shrinks, 2 with -short): no write of the record may name a node that
// has left, and each leader's stop hands over in one write. Both check
// the nodes' logs as above and a history of the store's writes, and log
// every leaderless gap with its bound: 10 ms, times LEADERFEED_TEST_SCALE
// and the load measured around it.
//
// By default each kind of fault is injected 20 times (5 with -short), a
// failover 10 times.
// LEADERFEED_SOAK=<faults> turns each test into a soak: that many faults in
// total, spread evenly over the kinds, and a summary table printed at the
// end (see SOAK.md). LEADERFEED_SEED replays the order of a run's faults
// and its random choices.
package integration
