// bench fence measures what fenced transactions cost a leader on
// PostgreSQL (issue 42): a leader runs -rate transactions a second, each
// holding its transaction open -hold after postgres.Fence (the lock the
// fence takes holds off the leader's own renewals), while a second node
// follows. It runs a phase without the fence and one with it, -duration
// each, and prints a Markdown table: renewals and their latency (p50,
// p99, max), leases lost (leadership ended while the phase ran), and the
// transactions done, fenced or failed.
//
//	go run . fence -postgres "$LEADERFEED_POSTGRES_URL"
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/postgres"
)

// fenceMain is "bench fence".
func fenceMain(args []string) error {
	fs := flag.NewFlagSet("bench fence", flag.ContinueOnError)
	url := fs.String("postgres", os.Getenv("LEADERFEED_POSTGRES_URL"), "PostgreSQL URL")
	duration := fs.Duration("duration", 60*time.Second, "length of each phase")
	rate := fs.Int("rate", 100, "transactions a second")
	hold := fs.Duration("hold", 5*time.Millisecond, "how long each transaction stays open after the fence")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *url == "" {
		return errors.New("fence: no PostgreSQL: give -postgres or set LEADERFEED_POSTGRES_URL")
	}
	md, err := runFence(context.Background(), *url, *duration, *rate, *hold)
	fmt.Print(md)
	return err
}

// result is what one phase measured.
type fenceResult struct {
	phase                      string
	renew                      summary
	renewErrs, lost            int
	txDone, txFenced, txFailed int
	tx                         summary
	heartbeat                  time.Duration
	firstErr                   error // of the failed transactions
}

// runFence runs the two phases and returns their table in Markdown.
func runFence(ctx context.Context, url string, duration time.Duration, rate int, hold time.Duration) (string, error) {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return "", err
	}
	defer pool.Close()
	var b [4]byte
	_, _ = rand.Read(b[:])
	opts := postgres.Options{Table: "fencecost_" + hex.EncodeToString(b[:])}
	data := pgx.Identifier{opts.Table + "_data"}.Sanitize()
	fn, _ := postgres.FenceFunction(opts)
	defer func() {
		ctx := context.WithoutCancel(ctx)
		_, _ = pool.Exec(ctx, "DROP TABLE IF EXISTS "+data+", "+pgx.Identifier{opts.Table}.Sanitize())
		_, _ = pool.Exec(ctx, "DROP FUNCTION IF EXISTS "+fn+"(text, bigint)")
	}()
	if _, err := pool.Exec(ctx, "CREATE TABLE "+data+" (term bigint NOT NULL, at timestamptz NOT NULL)"); err != nil {
		return "", err
	}
	load0 := loadavg()
	var results []fenceResult
	for _, fenced := range []bool{false, true} {
		r, err := fencePhase(ctx, pool, opts, data, fenced, duration, rate, hold)
		if err != nil {
			return "", err
		}
		results = append(results, r)
	}
	var md strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&md, format, args...) }
	p("\n%d transactions a second, each open %v after the fence; %v a phase; default timing (heartbeat %v); load %s at the start, %s at the end\n\n",
		rate, hold, duration, results[0].heartbeat, load0, loadavg())
	p("| phase | renewals | renewal p50 | p99 | max | renewal errors | leases lost | transactions | fenced | failed | tx p50 | tx p99 |\n")
	p("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range results {
		p("| %s | %d | %s ms | %s ms | %s ms | %d | %d | %d | %d | %d | %s ms | %s ms |\n", r.phase, r.renew.n, ms(r.renew.p50), ms(r.renew.p99),
			ms(r.renew.max), r.renewErrs, r.lost, r.txDone, r.txFenced, r.txFailed, ms(r.tx.p50), ms(r.tx.p99))
	}
	for _, r := range results {
		if r.firstErr != nil {
			p("\n%s: first failed transaction: %v\n", r.phase, r.firstErr)
		}
	}
	return md.String(), nil
}

// fencePhase runs a leader and a follower on one election of the table for
// duration, the leader's job running rate transactions a second.
func fencePhase(ctx context.Context, pool *pgxpool.Pool, opts postgres.Options, data string, fenced bool,
	duration time.Duration, rate int, hold time.Duration) (fenceResult, error) {
	name := "unfenced"
	if fenced {
		name = "fenced"
	}
	election := "fencecost-" + name
	var mu sync.Mutex
	var renewals []time.Duration
	res := fenceResult{phase: name, heartbeat: heartbeat.DefaultTiming().HeartbeatInterval}
	trace := &base.Trace{
		RenewDone: func(i base.RenewInfo) {
			mu.Lock()
			defer mu.Unlock()
			if i.Err != nil {
				res.renewErrs++
				return
			}
			renewals = append(renewals, i.Latency)
		},
	}
	newFeed := func(node string, t *base.Trace) (*base.Feed, error) {
		b, err := postgres.New(pool, election, opts)
		if err != nil {
			return nil, err
		}
		return base.New(b, node, base.Options{Trace: t})
	}
	leader, err := newFeed("leader", trace)
	if err != nil {
		return res, err
	}
	follower, err := newFeed("follower", nil)
	if err != nil {
		return res, err
	}
	defer follower.Stop(context.Background())

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var (
		txs     []time.Duration
		elected int
		began   = make(chan struct{})
		ended   = make(chan struct{}) // the measured time is over
	)
	done := make(chan error, 1)
	go func() {
		done <- leader.Run(runCtx, func(lctx context.Context, term uint64) error {
			mu.Lock()
			elected++
			if elected == 1 {
				close(began)
			}
			mu.Unlock()
			tick := time.NewTicker(time.Second / time.Duration(rate))
			defer tick.Stop()
			for {
				select {
				case <-lctx.Done():
					return nil
				case <-ended:
					<-lctx.Done()
					return nil
				case <-tick.C:
				}
				start := time.Now()
				err := fencedTx(lctx, pool, opts, data, election, term, fenced, hold)
				took := time.Since(start)
				mu.Lock()
				switch {
				case err == nil:
					res.txDone++
					txs = append(txs, took)
				case errors.Is(err, base.ErrFenced):
					res.txFenced++
				default:
					res.txFailed++
					if res.firstErr == nil {
						res.firstErr = err
					}
				}
				mu.Unlock()
			}
		})
	}()
	select {
	case <-began:
	case err := <-done:
		return res, fmt.Errorf("%s: Run: %w", name, err)
	case <-time.After(30 * time.Second):
		return res, fmt.Errorf("%s: no leader within 30 s", name)
	}
	if err := follower.Start(ctx); err != nil {
		return res, err
	}
	mu.Lock()
	renewals, txs = renewals[:0], txs[:0]
	res.renewErrs, res.txDone, res.txFenced, res.txFailed, res.firstErr = 0, 0, 0, 0, nil
	mu.Unlock()
	time.Sleep(duration)
	close(ended)
	mu.Lock()
	lost := elected - 1
	if !leader.IsLeader() {
		lost++
	}
	res.lost = lost
	res.renew = summarize(renewals)
	res.tx = summarize(txs)
	out := res // what the job does after stop is not measured
	mu.Unlock()
	stop()
	if err := <-done; err != nil {
		return out, fmt.Errorf("%s: Run: %w", name, err)
	}
	return out, nil
}

// fencedTx is one transaction of the leader: (fence,) insert, stay open
// hold, commit; bounded by the leader context.
func fencedTx(ctx context.Context, pool *pgxpool.Pool, opts postgres.Options, data, election string, term uint64,
	fenced bool, hold time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if fenced {
		if err := postgres.Fence(ctx, tx, opts, election, term); err != nil {
			return err
		}
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+data+" VALUES ($1, now())", int64(term)); err != nil {
		return err
	}
	time.Sleep(hold)
	return tx.Commit(ctx)
}
