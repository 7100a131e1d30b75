//go:build linux

package integration

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// fenceEvery is how often a leading node runs a fenced transaction (on
// average) when config.fence is set.
const fenceEvery = 15 * time.Millisecond

// fenceServer is a server the nodes can run fenced writes on (see
// FenceSchemaSQL): PostgreSQL.
type fenceServer interface {
	// adminURL is a URL of the server, not through any node's proxy.
	adminURL() string
}

func (s *pgServer) adminURL() string { return s.url(s.target()) }

// prepareFence makes the tables of the fenced writes and the head row of
// the election.
func (h *harness) prepareFence(ctx context.Context) error {
	fs, ok := h.srv.(fenceServer)
	if !ok {
		return fmt.Errorf("fenced writes: %s: %w", h.srv.name(), errUnsupported)
	}
	conn, err := pgx.Connect(ctx, fs.adminURL())
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, FenceSchemaSQL); err != nil {
		return fmt.Errorf("fenced writes: schema: %w", err)
	}
	if _, err := conn.Exec(ctx, FenceHeadSQL, h.cfg.election); err != nil {
		return fmt.Errorf("fenced writes: head row: %w", err)
	}
	return nil
}

// fenceRow is one committed fenced write, from FenceLogTable.
type fenceRow struct {
	term, maxTerm uint64
	node          string
	seq, mono     int64
}

func (r fenceRow) stale() bool { return r.term < r.maxTerm }

// checkFence reads the fenced writes that committed and returns a table of
// them by the kind of the fault last injected before each (commits and
// stale ones from the database, refusals, cancellations and other errors
// from the nodes' fence lines), and an error when a stale write committed,
// none committed at all, or the head row disagrees with the log.
func (h *harness) checkFence(ctx context.Context, logs []NodeLog, faults []Fault) (string, error) {
	conn, err := pgx.Connect(ctx, h.srv.(fenceServer).adminURL())
	if err != nil {
		return "", err
	}
	defer conn.Close(context.Background())
	var headCommits, headStale int64
	if err := conn.QueryRow(ctx, "SELECT commits, stale FROM "+FenceHeadTable+" WHERE election = $1", h.cfg.election).
		Scan(&headCommits, &headStale); err != nil {
		return "", fmt.Errorf("fenced writes: head row: %w", err)
	}
	rows, err := conn.Query(ctx, "SELECT term, max_term, node, seq, mono FROM "+FenceLogTable+" WHERE election = $1 ORDER BY id",
		h.cfg.election)
	if err != nil {
		return "", err
	}
	log, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (fenceRow, error) {
		var r fenceRow
		err := row.Scan(&r.term, &r.maxTerm, &r.node, &r.seq, &r.mono)
		return r, err
	})
	if err != nil {
		return "", fmt.Errorf("fenced writes: log: %w", err)
	}
	sum, errs := fenceSummary(log, logs, faults, h.cfg.kinds)
	if int64(len(log)) != headCommits || int64(countStale(log)) != headStale {
		errs = append(errs, fmt.Sprintf("the head row counts %d commits, %d stale; the log has %d, %d stale",
			headCommits, headStale, len(log), countStale(log)))
	}
	if len(errs) > 0 {
		return sum, errors.New("integration: fenced writes: " + strings.Join(errs, "\n"))
	}
	return sum, nil
}

func countStale(log []fenceRow) int {
	n := 0
	for _, r := range log {
		if r.stale() {
			n++
		}
	}
	return n
}

// lastFaultKind returns the kind of the last fault injected by t, or
// "none".
func lastFaultKind(faults []Fault, t int64) string {
	kind := "none"
	for _, f := range faults {
		if f.At <= t {
			kind = f.Kind
		}
	}
	return kind
}

// fenceSummary tabulates the fenced writes by fault kind and describes
// every stale commit, and the want of any commit, as a violation.
func fenceSummary(log []fenceRow, logs []NodeLog, faults []Fault, kinds []string) (string, []string) {
	type counts struct{ commits, stale, told, refused, cancelled, errors int64 }
	by := map[string]*counts{}
	at := func(t int64) *counts {
		k := lastFaultKind(faults, t)
		if by[k] == nil {
			by[k] = &counts{}
		}
		return by[k]
	}
	var errs []string
	for _, r := range log {
		c := at(r.mono)
		c.commits++
		if r.stale() {
			c.stale++
			if len(errs) < 20 {
				errs = append(errs, fmt.Sprintf("stale commit: %s's write %d of term %d, sent at %s (after %s), committed after term %d began",
					r.node, r.seq, r.term, secs(r.mono), lastFaultKind(faults, r.mono), r.maxTerm))
			}
		}
	}
	for _, lg := range logs {
		for _, l := range lg.Lines {
			if l.Kind == KindFence {
				c := at(l.Mono)
				c.told += l.Count
				c.refused += l.Refused
				c.cancelled += l.Cancelled
				c.errors += l.Errors
			}
		}
	}
	var b strings.Builder
	b.WriteString("| fault | fenced commits | stale commits | refused (ErrFenced) | cancelled | other errors |\n")
	b.WriteString("| --- | ---: | ---: | ---: | ---: | ---: |\n")
	var all counts
	for _, k := range append([]string{"none"}, kinds...) {
		c := by[k]
		if c == nil {
			if k == "none" {
				continue
			}
			c = &counts{}
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d |\n", k, c.commits, c.stale, c.refused, c.cancelled, c.errors)
		all.commits += c.commits
		all.stale += c.stale
		all.told += c.told
		all.refused += c.refused
		all.cancelled += c.cancelled
		all.errors += c.errors
	}
	fmt.Fprintf(&b, "| **all** | %d | %d | %d | %d | %d |\n", all.commits, all.stale, all.refused, all.cancelled, all.errors)
	fmt.Fprintf(&b, "(fault: the last injected before the write was sent, or its term's writes ended; commits in the database, "+
		"%d of them reported by the nodes; killed nodes report none)\n", all.told)
	if all.stale > int64(len(errs)) && len(errs) == 20 {
		errs = append(errs, fmt.Sprintf("... %d stale commits in all", all.stale))
	}
	if len(log) == 0 {
		errs = append(errs, "no fenced write committed: the check saw nothing")
	}
	return b.String(), errs
}
