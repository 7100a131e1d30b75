package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/health"
	"github.com/leaderfeed/leaderfeed/otelmetrics"
)

const runUse = `Usage: leaderfeed run --store URL --election NAME [flags] -- CMD [ARGS...]

Campaigns in the election and runs CMD while this process leads, with
LEADERFEED_TERM (the fencing token), LEADERFEED_ELECTION and LEADERFEED_NODE
in its environment. CMD runs in a process group of its own; its output
passes through unchanged. When leadership ends, the group gets SIGTERM at
once and SIGKILL after --grace. When CMD exits by itself, leaderfeed resigns
(the next leader takes over in milliseconds) and exits with CMD's status,
or with --restart campaigns again. On SIGINT or SIGTERM it stops CMD the
same way, resigns and exits 0. On Linux CMD gets SIGKILL if leaderfeed dies,
kill -9 included.

Each run keeps a presence record in the store (one write per quarter of
the lease), so that resigning hands the election over in one write: to
the live run of the highest --priority, then the one that started last,
then the lowest --id. On SIGTERM it withdraws the record first, so in a
rolling restart (start a new node, then stop an old one) leadership
moves once, to a new node. --no-participate writes no presence record:
resigning then leaves the election vacant, for any node to claim.

When the store refuses (a missing privilege, a missing table), run exits
with 4 and one line naming the cause and the fix, also when the refusal
comes while it runs (a GRANT revoked): retrying cannot fix it.

When the store is lost, a line says so on stderr ("leaderfeed: store
lost"), and another when it is back; CMD is stopped at the end of the
lease and run campaigns on, elected again once the store is back. With
--max-outage D it exits 1 once the store has not answered for D.

The store URL may come from --store, --store-file or LEADERFEED_STORE:
the last two keep a password out of ps.

Exit codes: 0 stopped by a signal; 1 the store lost for longer than
--max-outage; 2 usage; 3 store not reached within --connect-timeout; 4
store refuses; 126 CMD not executable; 127 CMD not found; CMD's status
(128+N if killed by signal N) when CMD exits by itself without --restart.
`

// childExit is CMD's exit status, for leaderfeed's own.
type childExit struct {
	code int
	err  error
}

func (e *childExit) Error() string { return fmt.Sprintf("CMD exited: %v", e.err) }

func runCommand(args []string, stdout, stderr io.Writer) error {
	var c common
	fs := newFlagSet("run", runUse, stdout, stderr)
	c.register(fs)
	c.registerLog(fs, "info")
	c.registerRun(fs)
	c.registerOutage(fs)
	host, _ := os.Hostname()
	id := fs.String("id", fmt.Sprintf("%s-%d", host, os.Getpid()), "node id, unique in the election")
	value := fs.String("value", "", "value published while leading (e.g. this node's address)")
	grace := fs.Duration("grace", 10*time.Second, "time between SIGTERM and SIGKILL when leadership ends")
	restart := fs.Bool("restart", false, "when CMD exits by itself, resign and campaign again instead of exiting with its status")
	healthAddr := fs.String("health", "", "serve the health check on ADDR at /healthz (200 ok, 503 when wedged)")
	healthBound := fs.Duration("health-bound", 0, "how long the feed may be wedged before /healthz fails (default 2 x election-timeout-max)")
	metricsAddr := fs.String("metrics", "", "serve Prometheus metrics on ADDR at /metrics")
	noParticipate := fs.Bool("no-participate", false, "keep no presence record: resigning (SIGTERM, CMD exited) leaves the election vacant for any node, instead of handing it to the live node of the highest priority, then the one that started last")
	priority := fs.Int("priority", 0, fmt.Sprintf("which node should lead, in [%d, %d]: a leader hands over to a live node of higher priority", base.MinPriority, base.MaxPriority))

	flagArgs, cmdArgs, dashes := splitDashes(args)
	if err := parseFlags(fs, flagArgs); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return exitf(exitUsage, "unexpected argument %q: put CMD after -- (leaderfeed run [flags] -- CMD [ARGS...])", fs.Arg(0))
	}
	if !dashes {
		return exitf(exitUsage, "missing -- before CMD (leaderfeed run [flags] -- CMD [ARGS...])")
	}
	if len(cmdArgs) == 0 {
		return exitf(exitUsage, "no CMD after --")
	}
	u, timing, err := c.check(true, stderr)
	if err != nil {
		return err
	}
	if *grace < 0 {
		return exitf(exitUsage, "bad --grace %v: must not be negative", *grace)
	}
	if *priority < base.MinPriority || *priority > base.MaxPriority {
		return exitf(exitUsage, "bad --priority %d: must be in [%d, %d]", *priority, base.MinPriority, base.MaxPriority)
	}
	if *noParticipate && isSet(fs, "priority") {
		return exitf(exitUsage, "--priority needs the presence record that --no-participate leaves out: give one of them")
	}
	path, err := lookCmd(cmdArgs[0])
	if err != nil {
		return err
	}
	log := c.logger(stderr)

	// Listen before connecting, so that a taken port fails at once.
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			_ = l.Close()
		}
	}()
	listen := func(flagName, addr string) (net.Listener, error) {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, exitf(exitUsage, "--%s %s: %v", flagName, addr, err)
		}
		listeners = append(listeners, l)
		return l, nil
	}
	var healthL, metricsL net.Listener
	if *healthAddr != "" {
		if healthL, err = listen("health", *healthAddr); err != nil {
			return err
		}
	}
	if *metricsAddr != "" {
		if metricsL, err = listen("metrics", *metricsAddr); err != nil {
			return err
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	// --connect-timeout bounds the wait for the store, from the
	// connection to Start's last check.
	connectCtx, cancelConnect := context.WithTimeout(ctx, c.connectTimeout)
	defer cancelConnect()
	st, b, err := openBackend(connectCtx, u, &c, log)
	if err != nil {
		if ctx.Err() != nil {
			return nil // interrupted while connecting
		}
		return err
	}
	defer st.close()

	// Every store of this command keeps presence records (store.go).
	opts := base.Options{Timing: timing, Value: []byte(*value), Logger: log, Participate: !*noParticipate, Priority: *priority}
	var metrics *otelmetrics.Metrics
	var promReg *prometheus.Registry
	if metricsL != nil {
		promReg = prometheus.NewRegistry()
		exp, err := otelprom.New(otelprom.WithRegisterer(promReg))
		if err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
		defer func() { _ = mp.Shutdown(context.Background()) }()
		if metrics, err = otelmetrics.New(mp); err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
		opts.Trace = metrics.Trace()
	}
	feed, err := base.New(b, *id, opts)
	if err != nil {
		_ = b.Close()
		return classify(&c, err)
	}
	outageSub := feed.Subscribe(ctx) // before Start: every failure is seen
	if metrics != nil {
		stopMetrics, err := metrics.Observe(feed)
		if err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
		defer stopMetrics()
	}
	err = feed.Start(connectCtx) // waits for the store, as openBackend does
	cancelConnect()
	if err != nil {
		_ = feed.Stop(context.Background())
		if ctx.Err() != nil {
			return nil // interrupted while connecting
		}
		return classify(&c, err)
	}

	var servers []*http.Server
	serve := func(l net.Listener, path string, h http.Handler) {
		mux := http.NewServeMux()
		mux.Handle(path, h)
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		servers = append(servers, srv)
		go func() { _ = srv.Serve(l) }()
	}
	if healthL != nil {
		serve(healthL, "/healthz", health.Handler(feed, *healthBound))
	}
	if metricsL != nil {
		serve(metricsL, "/metrics", promhttp.HandlerFor(promReg, promhttp.HandlerOpts{}))
	}
	defer func() {
		for _, s := range servers {
			sctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = s.Shutdown(sctx)
			cancel()
		}
	}()

	// An outage longer than --max-outage ends Run as a signal does (CMD
	// stopped, the election handed over if the store takes it), and
	// run exits 1.
	runCtx, endRun := context.WithCancelCause(ctx)
	defer endRun(nil)
	outageCtx, stopOutages := context.WithCancel(ctx)
	outagesDone := make(chan struct{})
	go func() {
		defer close(outagesDone)
		newOutages(feed, log, timing, c.maxOutage).run(outageCtx, outageSub, endRun)
	}()
	defer func() { stopOutages(); <-outagesDone }()

	sp := newSpawner()
	r := &runner{feed: feed, log: log, path: path, args: cmdArgs, grace: *grace, restart: *restart, spawner: sp,
		env: []string{"LEADERFEED_ELECTION=" + c.election, "LEADERFEED_NODE=" + *id}}
	err = feed.Run(runCtx, r.lead)
	if errors.Is(err, base.ErrRefused) {
		return classify(&c, err)
	}
	if cause := context.Cause(runCtx); err == nil && errors.Is(cause, errOutage) {
		return &exitError{exitFailure, fmt.Errorf("store %s: %w", redact(c.store), cause)}
	}
	return err
}

// isSet reports whether the flag name was given on the command line.
func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// splitDashes splits args at the first "--".
func splitDashes(args []string) (flags, cmd []string, found bool) {
	i := slices.Index(args, "--")
	if i < 0 {
		return args, nil, false
	}
	return args[:i], args[i+1:], true
}

// lookCmd finds CMD as exec.LookPath does, with the exit codes of a shell.
func lookCmd(name string) (string, error) {
	path, err := exec.LookPath(name)
	if err == nil {
		return path, nil
	}
	if errors.Is(err, os.ErrPermission) || errors.Is(err, syscall.EACCES) {
		return "", exitf(exitNotExec, "CMD %q is not executable", name)
	}
	if fi, serr := os.Stat(name); serr == nil && (fi.IsDir() || fi.Mode()&0o111 == 0) {
		return "", exitf(exitNotExec, "CMD %q is not executable", name)
	}
	return "", exitf(exitNotFound, "CMD %q not found", name)
}

var errStart = errors.New("cannot start CMD")

// runner runs CMD for each term won.
type runner struct {
	feed    *base.Feed
	log     interface{ Info(string, ...any) }
	path    string
	args    []string
	env     []string
	grace   time.Duration
	restart bool
	spawner *spawner
}

// lead runs CMD for one term, under the term's context.
func (r *runner) lead(ctx context.Context, term uint64) error {
	cmd := r.spawner.command(r.path, r.args[0], r.args[1:])
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), append(slices.Clone(r.env), "LEADERFEED_TERM="+strconv.FormatUint(term, 10))...)
	cmd.SysProcAttr = sysProcAttr()
	release, cmdPid, err := r.spawner.start(cmd)
	if err != nil {
		code := exitNotExec
		if errors.Is(err, os.ErrNotExist) {
			code = exitNotFound
		}
		return &exitError{code, fmt.Errorf("%w %q: %v", errStart, r.args[0], err)}
	}
	// pid leads CMD's process group: CMD's guard on Linux, else CMD.
	pid := cmd.Process.Pid
	r.log.Info("leaderfeed: CMD started", "term", term, "pid", cmdPid, "group", pid)
	exited := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		release()
		exited <- err
	}()

	select {
	case err := <-exited:
		killGroup(pid, syscall.SIGKILL) // what CMD left behind in its group
		status := exitStatus(cmd.ProcessState)
		r.log.Info("leaderfeed: CMD exited by itself", "term", term, "status", status)
		if !r.restart {
			return &childExit{code: status, err: err}
		}
		// Hand over at once and campaign again: Run starts CMD when this
		// node wins another term.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.feed.Timing().ElectionTimeoutMax)
		defer cancel()
		if err := r.feed.Resign(rctx); err != nil && !errors.Is(err, base.ErrNotLeader) {
			r.log.Info("leaderfeed: resign failed", "term", term, "err", err)
		}
		return nil
	case <-ctx.Done():
	}
	// Leadership ended (or leaderfeed was told to stop): SIGTERM now,
	// SIGKILL after the grace period.
	r.log.Info("leaderfeed: stopping CMD", "term", term, "pid", cmdPid, "group", pid, "cause", context.Cause(ctx))
	killGroup(pid, syscall.SIGTERM)
	t := time.NewTimer(r.grace)
	defer t.Stop()
	select {
	case <-exited:
	case <-t.C:
		r.log.Info("leaderfeed: CMD still running after the grace period: SIGKILL", "term", term, "pid", cmdPid, "group", pid)
		killGroup(pid, syscall.SIGKILL)
		<-exited
	}
	killGroup(pid, syscall.SIGKILL)
	r.log.Info("leaderfeed: CMD ended", "term", term, "status", exitStatus(cmd.ProcessState))
	return nil
}

// killGroup signals CMD's process group (CMD leads it).
func killGroup(pgid int, sig syscall.Signal) {
	_ = syscall.Kill(-pgid, sig)
}

// exitStatus is a shell's view of how a process ended.
func exitStatus(ps *os.ProcessState) int {
	if ps == nil {
		return exitFailure
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}
