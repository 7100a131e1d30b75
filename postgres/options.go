package postgres

import (
	"fmt"
	"log/slog"
	"regexp"

	"github.com/leaderfeed/leaderfeed/base"
)

// Defaults of Options.
const (
	// DefaultSchema is the schema of the election table.
	DefaultSchema = "public"
	// DefaultTable is the name of the election table.
	DefaultTable = "leaderfeed"
	// DefaultChannelPrefix is the NOTIFY channel, also the name of the
	// triggers and the prefix of the trigger functions.
	DefaultChannelPrefix = "leaderfeed"
	// MaxChannelPrefixLen is the longest ChannelPrefix: the trigger functions
	// are named ChannelPrefix+"_notify_rows" and ChannelPrefix+"_notify_change"
	// (and ChannelPrefix+"_notify_record" in versions before the
	// statement-level triggers),
	// and PostgreSQL identifiers have at most 63 bytes.
	MaxChannelPrefixLen = 63 - len("_notify_record")
)

// Options configures a Store (and the Backend of New). The zero value of
// every field means its documented default.
type Options struct {
	// Schema is the schema of the election table and of the trigger
	// functions. Default "public".
	Schema string
	// Table is the election table, one row per election. Default
	// "leaderfeed".
	Table string
	// WatchTable optionally names a table of yours, in WatchSchema, whose
	// row changes arrive as backend.OtherChanged notifications. It must not be
	// the election table. Its trigger costs a catalog lookup (of the primary
	// key) and a NOTIFY per changed row. Empty: none.
	WatchTable string
	// WatchSchema is the schema of WatchTable. Default: Schema.
	WatchSchema string
	// ChannelPrefix is the NOTIFY channel the triggers send on; it also
	// names the triggers (ChannelPrefix+"_ins", "_upd" and "_del" on the
	// election table, ChannelPrefix on WatchTable) and prefixes the trigger
	// functions. At most
	// MaxChannelPrefixLen bytes. Default "leaderfeed".
	ChannelPrefix string
	// NoCreate stops Create from creating anything: it then only checks that
	// the schema, the election table, the trigger functions and the triggers
	// (on the election table and on WatchTable) exist, and fails with an
	// error matching base.ErrInvalidConfig if not (an administrator runs
	// SchemaSQL first). Default false: Create creates what is missing, as in
	// every backend.
	NoCreate bool
	// Logger receives the Store's LISTEN connects and drops (Info, Warn)
	// and dropped notifications of other tables (Debug). Default: discard.
	Logger *slog.Logger
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// withDefaults returns o with defaults applied and every name checked.
func (o Options) withDefaults() (Options, error) {
	if o.Schema == "" {
		o.Schema = DefaultSchema
	}
	if o.Table == "" {
		o.Table = DefaultTable
	}
	if o.WatchSchema == "" {
		o.WatchSchema = o.Schema
	}
	if o.ChannelPrefix == "" {
		o.ChannelPrefix = DefaultChannelPrefix
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	names := []struct{ field, v string }{
		{"Schema", o.Schema},
		{"Table", o.Table},
		{"WatchSchema", o.WatchSchema},
		{"ChannelPrefix", o.ChannelPrefix},
	}
	if o.WatchTable != "" {
		names = append(names, struct{ field, v string }{"WatchTable", o.WatchTable})
	}
	for _, n := range names {
		if !identRE.MatchString(n.v) {
			return o, fmt.Errorf("postgres: Options.%s %q is not a plain identifier (want ^[A-Za-z_][A-Za-z0-9_]{0,62}$): %w",
				n.field, n.v, base.ErrInvalidConfig)
		}
	}
	if len(o.ChannelPrefix) > MaxChannelPrefixLen {
		return o, fmt.Errorf("postgres: Options.ChannelPrefix %q is longer than %d bytes: %w",
			o.ChannelPrefix, MaxChannelPrefixLen, base.ErrInvalidConfig)
	}
	if o.WatchTable != "" && o.WatchSchema == o.Schema && o.WatchTable == o.Table {
		return o, fmt.Errorf("postgres: Options.WatchTable %q is the election table: %w", o.WatchTable, base.ErrInvalidConfig)
	}
	return o, nil
}
