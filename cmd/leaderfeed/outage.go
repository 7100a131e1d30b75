package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// errOutage is the cause of the end of run and watch when the store was
// lost for longer than --max-outage: exit code 1.
var errOutage = errors.New("store lost")

// outages tells an operator, on standard error at Warn (the default
// level of watch shows it), when the store is lost and when it is back,
// and ends the command when it was lost for longer than max (0: never).
//
// The store is lost when the Feed's calls fail (its changefeed is down,
// or its reads or renewals fail) and it has not answered anything for
// LeaseDuration: a blip (one failed renewal, a changefeed reopened at
// once) says nothing. It is back at the first answer after that. The
// Feed itself goes on as always: a leader stops leading at the end of
// its lease, every node campaigns again when the store is back.
type outages struct {
	feed  *base.Feed
	log   *slog.Logger
	after time.Duration // silence that makes a failing store lost
	every time.Duration // how often Health is looked at
	max   time.Duration
}

func newOutages(feed *base.Feed, log *slog.Logger, t heartbeat.Timing, maxOutage time.Duration) *outages {
	t = t.WithDefaults()
	return &outages{feed: feed, log: log, after: t.LeaseDuration,
		every: min(max(t.HeartbeatInterval/2, 10*time.Millisecond), 250*time.Millisecond), max: maxOutage}
}

// run watches until ctx ends. When the store was lost for longer than
// max it calls end with an error matching errOutage (exit code 1) and
// returns. Subscribe sub before the Feed starts, so that the last error
// is known.
func (o *outages) run(ctx context.Context, sub *base.Subscription, end func(error)) {
	tick := time.NewTicker(o.every)
	defer tick.Stop()
	var (
		lastErr error     // the last failed call's error
		lostAt  time.Time // the last answer before the loss; zero: not lost
	)
	events := sub.C
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			if (e.Type == base.EventError || e.Type == base.EventSubscribeError) && e.Err != nil {
				lastErr = e.Err
			}
			continue
		case <-tick.C:
		}
		h := o.feed.Health()
		if h.Started.IsZero() {
			continue
		}
		now := time.Now()
		last := h.LastContact
		if last.IsZero() {
			last = h.Started
		}
		failing := !h.FeedDownSince.IsZero() || !h.ReadsFailingSince.IsZero() || !h.RenewalsFailingSince.IsZero()
		switch {
		case lostAt.IsZero() && failing && now.Sub(last) > o.after:
			lostAt = last
			o.log.Warn("leaderfeed: store lost", "silent_for", now.Sub(last).Round(time.Millisecond), "err", lastErr)
		case !lostAt.IsZero() && h.LastContact.After(lostAt):
			o.log.Warn("leaderfeed: store back", "lost_for", h.LastContact.Sub(lostAt).Round(time.Millisecond))
			lostAt = time.Time{}
		}
		if !lostAt.IsZero() && o.max > 0 && now.Sub(lostAt) > o.max {
			end(fmt.Errorf("%w: no answer for %v, longer than --max-outage %v; last error: %v",
				errOutage, now.Sub(lostAt).Round(time.Millisecond), o.max, lastErr))
			return
		}
	}
}
