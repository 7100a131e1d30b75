package base

// Internal values the external tests check against.
var (
	DefaultHealthBound = defaultHealthBound
	RefusalRetry       = refusalRetry
)

// SharedGoroutines returns how many goroutines e's elections share now
// (its Runner's).
func SharedGoroutines(e *Elections) int { return e.run.Workers() }

// MaxInFlight is how many batches of writes one Elections has in flight
// at once.
const MaxInFlight = maxInFlight
