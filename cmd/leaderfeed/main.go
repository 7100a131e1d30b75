package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/internal/storewait"
)

// Exit codes (see the package doc): one per cause, the same in every
// command.
const (
	exitOK          = 0
	exitFailure     = 1   // a failure while running: the store lost, a stop that failed
	exitUsage       = 2   // bad flags or arguments: URL, missing --, election name, timing
	exitUnreachable = 3   // the store could not be reached within --connect-timeout
	exitRefused     = 4   // the store refuses: privilege, password, missing database or table
	exitNotExec     = 126 // CMD exists but cannot be run
	exitNotFound    = 127 // CMD not found
)

// exitError is an error with the exit code it calls for.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func exitf(code int, format string, args ...any) error {
	return &exitError{code: code, err: fmt.Errorf(format, args...)}
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == guardArg {
		os.Exit(guardMain(os.Args[2:]))
	}
	os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `leaderfeed: leader election on PostgreSQL, MongoDB or RethinkDB from the shell.

Usage:
  leaderfeed run    --store URL --election NAME [flags] -- CMD [ARGS...]
  leaderfeed status --store URL --election NAME [--json]
  leaderfeed watch  --store URL --election NAME
  leaderfeed schema --store postgres://... [--schema S] [--table T]

Run "leaderfeed COMMAND --help" for a command's flags.
Store URLs: postgres://, postgresql://, mongodb://, mongodb+srv://,
rethinkdb://[user[:password]@]host:port/database. To keep a password out
of ps, give the URL in LEADERFEED_STORE or a file (--store-file), or
(postgres) the password in PGPASSWORD or ~/.pgpass.
Exit codes, the same for every command:
  0    ok; run, watch: stopped by SIGINT or SIGTERM
  1    a failure while running: run, watch: the store lost for longer than
       --max-outage (without it they wait); status: a read that failed
  2    usage: a bad flag, URL, election name or timing, a missing --
  3    the store could not be reached within --connect-timeout
  4    the store refuses: a missing privilege, a wrong password, a missing
       database or table (see --no-create and leaderfeed schema), a table
       of another shape, a server without a capability leaderfeed needs
  126  CMD not executable; 127 CMD not found
  N    run without --restart: CMD's own status when it exits by itself
       (128+N if killed by signal N)
`

// realMain runs the command line args and returns the exit code.
func realMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	var err error
	switch args[0] {
	case "run":
		err = runCommand(args[1:], stdout, stderr)
	case "status":
		err = statusCommand(args[1:], stdout, stderr)
	case "watch":
		err = watchCommand(args[1:], stdout, stderr)
	case "schema":
		err = schemaCommand(args[1:], stdout, stderr)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return exitOK
	default:
		fmt.Fprintf(stderr, "leaderfeed: unknown command %q (want run, status, watch or schema; see leaderfeed --help)\n", args[0])
		return exitUsage
	}
	if err == nil {
		return exitOK
	}
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	var ce *childExit
	if errors.As(err, &ce) {
		return ce.code
	}
	code := exitFailure
	var ee *exitError
	if errors.As(err, &ee) {
		code = ee.code
	}
	fmt.Fprintf(stderr, "leaderfeed %s: %s\n", args[0], cliWords(args[0]).Replace(strings.Join(strings.Fields(err.Error()), " ")))
	return code
}

// cliWords returns what turns the library's words in an error into the
// command's: the flags the user typed instead of the Options fields they
// set, and `leaderfeed schema` instead of postgres.SchemaSQL. status and
// watch never create anything, so their fix is run's.
func cliWords(command string) *strings.Replacer {
	noCreate := "and --no-create is given"
	create := "run without --no-create, which creates it"
	if command == "status" || command == "watch" {
		noCreate = "and " + command + " never creates it"
		create = "let `leaderfeed run` (without --no-create) create it"
	}
	return strings.NewReplacer(
		"and NoCreate is set", noCreate,
		"let Create make it (NoCreate unset)", create,
		"and set NoCreate", "and run with --no-create",
		"apply SchemaSQL (the output of `leaderfeed schema`)", "apply the output of `leaderfeed schema`",
		"Options.NoCreate", "--no-create",
		"Options.Table", "--table",
		"Options.Collection", "--table",
		"Options.Schema", "--schema",
		"MaxNameLen (", "the limit (",
		"heartbeat.MaxValueLen (", "the limit (",
		"invalid configuration: Value is", "invalid configuration: --value is",
		"HeartbeatInterval", "--heartbeat",
		"ElectionTimeoutMin", "--election-timeout-min",
		"ElectionTimeoutMax", "--election-timeout-max",
		"LeaseDuration", "--lease",
		"VacancyJitter", "--vacancy-jitter",
	)
}

// common holds the flags of the commands that reach the store (run,
// status, watch). Each command registers only the flags that mean
// something to it: register for all three, registerLog for run and watch,
// registerRun for run alone (status and watch never create anything and
// do not campaign, so --no-create and the timing flags are not theirs).
type common struct {
	store, storeFile       string
	election               string
	table, schema          string
	noCreate               bool
	connectTimeout         time.Duration
	maxOutage              time.Duration
	logLevel               string
	heartbeat, lease       time.Duration
	timeoutMin, timeoutMax time.Duration
	jitter, failover       time.Duration
}

func (c *common) register(fs *flag.FlagSet) {
	registerStore(fs, &c.store, &c.storeFile)
	fs.StringVar(&c.election, "election", "", "election name (required)")
	fs.StringVar(&c.table, "table", "", "election table (postgres, rethinkdb) or collection (mongodb); default leaderfeed")
	fs.StringVar(&c.schema, "schema", "", "postgres schema of the table; default public")
	fs.DurationVar(&c.connectTimeout, "connect-timeout", 10*time.Second,
		"how long to wait for the store at start, retrying at most 500 ms apart (a refusal fails at once)")
}

// storeEnv is the environment variable that names the store when
// neither --store nor --store-file does: unlike an argument, it is not
// shown to every user of the host by ps.
const storeEnv = "LEADERFEED_STORE"

// registerStore registers --store and --store-file (every command).
func registerStore(fs *flag.FlagSet, store, file *string) {
	fs.StringVar(store, "store", "", "store URL: postgres://, postgresql://, mongodb://, mongodb+srv://, rethinkdb://host:port/database; "+
		"or "+storeEnv+" in the environment, or --store-file (either keeps a password out of ps)")
	fs.StringVar(file, "store-file", "", "read the store URL from this file (its first line)")
}

// resolveStore returns the store URL: from --store, --store-file or
// storeEnv, in that order; giving both flags is a usage error. A URL
// with a password given in the arguments, where every user of the host
// can read it (ps, /proc), gets a one-line warning on stderr; so does one
// in a file that others than its owner may read.
func resolveStore(store, file string, stderr io.Writer) (string, error) {
	switch {
	case store != "" && file != "":
		return "", exitf(exitUsage, "give --store or --store-file, not both")
	case file != "":
		data, err := os.ReadFile(file)
		if err != nil {
			return "", exitf(exitUsage, "--store-file: %v", err)
		}
		line, _, _ := strings.Cut(string(data), "\n")
		raw := strings.TrimSpace(line)
		if raw == "" {
			return "", exitf(exitUsage, "--store-file %s: no store URL on its first line", file)
		}
		if fi, err := os.Stat(file); err == nil && fi.Mode().Perm()&0o077 != 0 && hasPassword(raw) {
			slog.New(slog.NewTextHandler(stderr, nil)).Warn("leaderfeed: the password in --store-file is readable by users other than its owner",
				"file", file, "mode", fmt.Sprintf("%04o", fi.Mode().Perm()), "fix", "chmod 600 "+file)
		}
		return raw, nil
	case store != "":
		if hasPassword(store) {
			slog.New(slog.NewTextHandler(stderr, nil)).Warn("leaderfeed: the password in --store is shown to every user of this host (ps, /proc)",
				"fix", "give the URL in "+storeEnv+" or --store-file, or leave the password out (postgres: PGPASSWORD or ~/.pgpass)")
		}
		return store, nil
	}
	return os.Getenv(storeEnv), nil
}

func (c *common) registerLog(fs *flag.FlagSet, logLevel string) {
	fs.StringVar(&c.logLevel, "log-level", logLevel, "log level on stderr: debug, info, warn, error")
}

// registerOutage registers --max-outage (run and watch).
func (c *common) registerOutage(fs *flag.FlagSet) {
	fs.DurationVar(&c.maxOutage, "max-outage", 0,
		"exit with code 1 once the store has not answered for this long (default 0: wait for it however long; the loss and the return are logged either way)")
}

func (c *common) registerRun(fs *flag.FlagSet) {
	fs.BoolVar(&c.noCreate, "no-create", false, "do not create the table: only check it exists (see leaderfeed schema)")
	fs.DurationVar(&c.heartbeat, "heartbeat", 0, "heartbeat interval (default 1s)")
	fs.DurationVar(&c.timeoutMin, "election-timeout-min", 0, "shortest election timeout (default 2s)")
	fs.DurationVar(&c.timeoutMax, "election-timeout-max", 0, "longest election timeout (default 4s)")
	fs.DurationVar(&c.lease, "lease", 0, "lease duration (default halfway between heartbeat and election-timeout-min)")
	fs.DurationVar(&c.jitter, "vacancy-jitter", 0, "largest delay before claiming a vacant election (default 0)")
	fs.DurationVar(&c.failover, "failover", 0, "derive every timing from the longest acceptable failover after a crash (heartbeat.TimingFor); excludes the other timing flags")
}

// check validates the flags that need no connection: usage errors. It
// resolves the store URL first (resolveStore).
func (c *common) check(needElection bool, stderr io.Writer) (*storeURL, heartbeat.Timing, error) {
	var err error
	if c.store, err = resolveStore(c.store, c.storeFile, stderr); err != nil {
		return nil, heartbeat.Timing{}, err
	}
	u, err := parseStore(c.store)
	if err != nil {
		return nil, heartbeat.Timing{}, &exitError{exitUsage, err}
	}
	if needElection {
		if c.election == "" {
			return nil, heartbeat.Timing{}, exitf(exitUsage, "--election is required")
		}
		if err := heartbeat.ValidateName("election name", c.election); err != nil {
			return nil, heartbeat.Timing{}, exitf(exitUsage, "bad --election: %v", err)
		}
	}
	if c.connectTimeout <= 0 {
		return nil, heartbeat.Timing{}, exitf(exitUsage, "bad --connect-timeout %v: must be positive", c.connectTimeout)
	}
	if c.maxOutage < 0 {
		return nil, heartbeat.Timing{}, exitf(exitUsage, "bad --max-outage %v: must not be negative", c.maxOutage)
	}
	t := heartbeat.Timing{HeartbeatInterval: c.heartbeat, ElectionTimeoutMin: c.timeoutMin,
		ElectionTimeoutMax: c.timeoutMax, LeaseDuration: c.lease, VacancyJitter: c.jitter}
	if c.failover != 0 {
		if t != (heartbeat.Timing{}) {
			return nil, heartbeat.Timing{}, exitf(exitUsage, "--failover excludes --heartbeat, --election-timeout-min/max, --lease and --vacancy-jitter")
		}
		if t, err = heartbeat.TimingFor(c.failover); err != nil {
			return nil, heartbeat.Timing{}, exitf(exitUsage, "bad --failover: %v", err)
		}
	}
	if err := validateTiming(t); err != nil {
		return nil, heartbeat.Timing{}, exitf(exitUsage, "bad timing: %v", err)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.logLevel)); c.logLevel != "" && err != nil {
		return nil, heartbeat.Timing{}, exitf(exitUsage, "bad --log-level %q: want debug, info, warn or error", c.logLevel)
	}
	return u, t, nil
}

// validateTiming validates t, the timing flags given, with the
// library's defaults for the others, and words the problems for what the
// user gave: a default is called one ("ElectionTimeoutMin (2s, the
// default)"), and a lease that was not given is not said to be 0s when no
// default lease could be derived (the default lies between the heartbeat
// and the shortest election timeout: a heartbeat not under that timeout
// leaves none, and that is the problem named).
var marginRE = regexp.MustCompile(`(ElectionTimeoutMin - LeaseDuration \([^)]*)\)`)

func validateTiming(t heartbeat.Timing) error {
	d := t.WithDefaults()
	err := d.Validate()
	if err == nil {
		return nil
	}
	prefix := heartbeat.ErrInvalidTiming.Error() + ": "
	if !strings.HasPrefix(err.Error(), prefix) {
		return err
	}
	given := []struct {
		name  string
		set   bool
		value time.Duration
	}{
		{"HeartbeatInterval", t.HeartbeatInterval != 0, d.HeartbeatInterval},
		{"ElectionTimeoutMin", t.ElectionTimeoutMin != 0, d.ElectionTimeoutMin},
		{"ElectionTimeoutMax", t.ElectionTimeoutMax != 0, d.ElectionTimeoutMax},
		{"LeaseDuration", t.LeaseDuration != 0, d.LeaseDuration},
	}
	var problems []string
	for _, p := range strings.Split(strings.TrimPrefix(err.Error(), prefix), "; ") {
		if t.LeaseDuration == 0 && d.LeaseDuration == 0 && strings.HasPrefix(p, "LeaseDuration must be positive") {
			continue // no default lease: the heartbeat's problem, named apart
		}
		if t.LeaseDuration == 0 {
			p = marginRE.ReplaceAllString(p, "${1}, with the default LeaseDuration "+d.LeaseDuration.String()+
				", halfway between HeartbeatInterval and ElectionTimeoutMin)")
		}
		for _, g := range given {
			if !g.set {
				// "ElectionTimeoutMin - LeaseDuration (x)" is a difference,
				// not the lease: keep it as it is.
				p = strings.ReplaceAll(p, "- "+g.name+" (", "- "+g.name+"\x00(")
				p = strings.ReplaceAll(p, g.name+" ("+g.value.String()+")", g.name+" ("+g.value.String()+", the default)")
				p = strings.ReplaceAll(p, "- "+g.name+"\x00(", "- "+g.name+" (")
			}
		}
		problems = append(problems, p)
	}
	return fmt.Errorf("%w: %s", heartbeat.ErrInvalidTiming, strings.Join(problems, "; "))
}

func (c *common) storeOptions() storeOptions {
	return storeOptions{table: c.table, schema: c.schema, noCreate: c.noCreate}
}

func (c *common) logger(stderr io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(c.logLevel))
	return slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
}

// helpOut prints the --help of a flag set (one per process run).
var helpOut = map[*flag.FlagSet]func(){}

// newFlagSet returns a flag set whose --help prints use and the flags to
// stdout, and whose errors go to stderr.
func newFlagSet(name, use string, stdout, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("leaderfeed "+name, flag.ContinueOnError)
	// Errors are reported by realMain, on one line; --help prints here.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	helpOut[fs] = func() {
		fs.SetOutput(stdout)
		fmt.Fprint(stdout, use)
		fmt.Fprintln(stdout, "\nFlags:")
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
	return fs
}

// parseFlags parses args; a flag error is a usage error, --help is
// flag.ErrHelp (exit 0).
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			helpOut[fs]()
			return err
		}
		return &exitError{exitUsage, err}
	}
	return nil
}

// openBackend connects to the store and makes the election's backend,
// waiting for a store that cannot be reached yet (storewait.Retry, as
// base.Feed.Start does) until ctx ends: the command's ctx bounded by
// --connect-timeout. Its errors carry their exit code.
func openBackend(ctx context.Context, u *storeURL, c *common, log *slog.Logger) (*store, backend.Election, error) {
	var st *store
	err := storewait.Retry(ctx, log, nil, func(ctx context.Context) (err error) {
		st, err = u.open(ctx, c.storeOptions())
		return err
	})
	if err != nil {
		return nil, nil, classify(c, err)
	}
	b, err := st.backend(c.election)
	if err != nil {
		st.close()
		return nil, nil, classify(c, err)
	}
	return st, b, nil
}

// classify gives a store error its exit code (one per cause), and names
// the store.
func classify(c *common, err error) error {
	var ee *exitError
	if errors.As(err, &ee) {
		return err
	}
	switch {
	case errors.Is(err, base.ErrRefused), errors.Is(err, backend.ErrUnsupported):
		return &exitError{exitRefused, fmt.Errorf("store %s: %w", redact(c.store), err)}
	case errors.Is(err, base.ErrInvalidConfig):
		return &exitError{exitUsage, err}
	}
	var nr *storewait.NotReached
	if errors.As(err, &nr) {
		err = nr.Last // what the store said; that the wait ended is said here
	}
	return &exitError{exitUnreachable, fmt.Errorf("store %s: not reached within --connect-timeout %v: %w", redact(c.store), c.connectTimeout, err)}
}
