package rethink

// The sorting of the server's errors into refusals (base.ErrRefused) and
// transient failures, on the driver's own error values.

import (
	"errors"
	"strings"
	"testing"

	r "gopkg.in/rethinkdb/rethinkdb-go.v6"

	"github.com/leaderfeed/leaderfeed/base"
)

func TestRefusalSorting(t *testing.T) {
	s := &Store{db: "app", table: "leaderfeed"}
	for _, tc := range []struct {
		name    string
		err     error
		refused bool
		words   []string
	}{
		// RethinkDB 2.4's words for a user without the permission; driver
		// v6 turns the PERMISSION_ERROR response into an r.RQLRuntimeError
		// whose message field is unexported, so the message stands in.
		{"permission", errors.New("rethinkdb: User `bob` does not have the required `write` permission. in:\nr.DB(\"app\")..."), true,
			[]string{"does not have the required", `r.db("app").table("leaderfeed").grant(USER, {read: true, write: true})`}},
		{"missing database", errors.New("rethinkdb: Database `app` does not exist. in:\nr.DB(\"app\")"), true, []string{"let Create make it", `r.dbCreate("app")`}},
		{"missing table", errors.New("rethinkdb: Table `app.leaderfeed` does not exist. in:\nr.DB(\"app\")"), true, []string{"tableCreate"}},
		// As the handshake builds it for a wrong password or an unknown
		// user (a test connecting with them would leak the goroutine that
		// the driver starts for a failed Connect).
		{"auth", r.RQLAuthError{RQLDriverError: r.RQLDriverError{}}, true, []string{"user and password"}},
		{"no primary replica", errors.New("rethinkdb: Primary replica for shard [\"\", +inf) not available in:"), false, nil},
		{"connection", r.RQLConnectionError{}, false, nil},
		{"closed", r.ErrConnectionClosed, false, nil},
	} {
		err := s.refusal("rethink: get", tc.err)
		if errors.Is(err, base.ErrRefused) != tc.refused {
			t.Errorf("%s: %v: refused %v, want %v", tc.name, err, !tc.refused, tc.refused)
			continue
		}
		if !errors.Is(err, tc.err) {
			t.Errorf("%s: %v does not wrap the driver's error", tc.name, err)
		}
		for _, w := range tc.words {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not name %q", tc.name, err, w)
			}
		}
	}
}
