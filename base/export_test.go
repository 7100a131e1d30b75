package base

// Internal values the external tests check against.
var (
	DefaultHealthBound = defaultHealthBound
	RefusalRetry       = refusalRetry
)
