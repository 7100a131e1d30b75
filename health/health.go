// Package health serves a Feed's liveness check over HTTP, for a probe
// such as Kubernetes' livenessProbe. It is apart from package base so that
// a program that serves no HTTP does not link net/http through leaderfeed.
package health

import (
	"fmt"
	"net/http"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
)

// Handler returns an http.Handler for a liveness probe of f (in the style
// of client-go's HealthzAdaptor): it answers 200 and "ok" while
// f.Healthy(bound) is nil, else 503 and the error, on one line. A bound of
// zero or less means the Feed's default, twice ElectionTimeoutMax. It never
// blocks on the store.
func Handler(f *base.Feed, bound time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if err := f.Healthy(bound); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "unhealthy: %v\n", err)
			return
		}
		fmt.Fprintln(w, "ok")
	})
}
