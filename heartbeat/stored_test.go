package heartbeat_test

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/leaderfeed/leaderfeed/heartbeat"
)

func TestLeaseMicros(t *testing.T) {
	us := time.Microsecond
	cases := []struct {
		lease time.Duration
		want  int64
		why   string
	}{
		{-time.Second, 0, "a negative lease stores no lease"},
		{-1, 0, "a negative lease stores no lease"},
		{0, 0, "no lease"},
		{1, 1, "a nanosecond rounds up to a whole microsecond"},
		{us - 1, 1, "below a microsecond rounds up"},
		{us, 1, "a whole microsecond stays"},
		{us + 1, 2, "one nanosecond over rounds up"},
		{1500*time.Millisecond + 250*us, 1500250, "whole microseconds stay"},
		{1500*time.Millisecond + 250*us + 1, 1500251, "a stored lease is never shorter than the writer's"},
		{heartbeat.MaxLease - 1, heartbeat.MaxLeaseMicros, "just under MaxLease rounds up to it"},
		{heartbeat.MaxLease, heartbeat.MaxLeaseMicros, "MaxLease"},
		{heartbeat.MaxLease + 1, heartbeat.MaxLeaseMicros + 1, "over MaxLease is over MaxLeaseMicros: Validate refuses it first"},
		{math.MaxInt64, math.MaxInt64/1000 + 1, "the longest Duration does not overflow"},
	}
	for _, c := range cases {
		if got := heartbeat.LeaseMicros(c.lease); got != c.want {
			t.Errorf("LeaseMicros(%d) = %d, want %d: %s", int64(c.lease), got, c.want, c.why)
		}
	}
	if heartbeat.MaxLeaseMicros != heartbeat.MaxLease.Microseconds() {
		t.Errorf("MaxLeaseMicros = %d, want %d", heartbeat.MaxLeaseMicros, heartbeat.MaxLease.Microseconds())
	}
}

func TestLeaseFromMicros(t *testing.T) {
	cases := []struct {
		us   int64
		want time.Duration
		ok   bool
	}{
		{math.MinInt64, 0, false},
		{-1, 0, false},
		{0, 0, true},
		{1, time.Microsecond, true},
		{1500250, 1500250 * time.Microsecond, true},
		{heartbeat.MaxLeaseMicros, heartbeat.MaxLease, true},
		{heartbeat.MaxLeaseMicros + 1, 0, false},
		{math.MaxInt64, 0, false},
	}
	for _, c := range cases {
		got, err := heartbeat.LeaseFromMicros(c.us)
		if c.ok && (err != nil || got != c.want) {
			t.Errorf("LeaseFromMicros(%d) = %v, %v; want %v", c.us, got, err, c.want)
		}
		if !c.ok && (!errors.Is(err, heartbeat.ErrInvalidRecord) || got != 0 || !strings.Contains(err.Error(), "µs is outside [0, 3600000000]")) {
			t.Errorf("LeaseFromMicros(%d) = %v, %v; want an error matching ErrInvalidRecord naming the range", c.us, got, err)
		}
	}
	// What LeaseMicros stores, LeaseFromMicros reads back no shorter.
	for _, d := range []time.Duration{0, 1, 999, time.Microsecond, 1500 * time.Millisecond, heartbeat.MaxLease - 1, heartbeat.MaxLease} {
		back, err := heartbeat.LeaseFromMicros(heartbeat.LeaseMicros(d))
		if err != nil || back < d || back-d >= time.Microsecond {
			t.Errorf("lease %v stored and read back as %v, %v; want within a microsecond above", d, back, err)
		}
	}
}

func TestValidateWrite(t *testing.T) {
	const max = 1 << 53
	led := heartbeat.Record{Election: "e", Leader: "a", Term: 3, Lease: time.Second}
	cases := []struct {
		name     string
		expected heartbeat.Record
		next     heartbeat.Record
		want     string // "" for none
	}{
		{"a first claim", heartbeat.Record{}, led, ""},
		{"a renewal", heartbeat.Record{Election: "e", Leader: "a", Term: 3, Revision: 7}, led, ""},
		{"the largest numbers", heartbeat.Record{Election: "e", Leader: "a", Term: max, Revision: max - 1}, heartbeat.Record{Election: "e", Leader: "a", Term: max}, ""},
		{"an invalid next", heartbeat.Record{}, heartbeat.Record{Election: "e", Value: []byte("v")}, "carries a value"},
		{"no election", heartbeat.Record{}, heartbeat.Record{Leader: "a"}, "election name is empty"},
		{"next term over", heartbeat.Record{}, heartbeat.Record{Election: "e", Leader: "a", Term: max + 1}, "term 9007199254740993 of election \"e\" exceeds"},
		{"expected term over", heartbeat.Record{Leader: "a", Term: max + 1, Revision: 1}, led, "expected term 9007199254740993"},
		{"no next revision", heartbeat.Record{Leader: "a", Term: 3, Revision: max}, led, "expected revision 9007199254740992 of election \"e\" leaves no next revision"},
		{"uint64 beyond int64", heartbeat.Record{}, heartbeat.Record{Election: "e", Leader: "a", Term: math.MaxUint64}, "exceeds"},
	}
	for _, c := range cases {
		err := heartbeat.ValidateWrite(c.expected, c.next, max)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v, want nil", c.name, err)
		case c.want != "" && (!errors.Is(err, heartbeat.ErrInvalidRecord) || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v, want an error matching ErrInvalidRecord saying %q", c.name, err, c.want)
		}
	}
	if err := heartbeat.ValidateWrite(heartbeat.Record{Leader: "a", Term: 3, Revision: math.MaxInt64 - 1}, led, math.MaxInt64); err != nil {
		t.Errorf("revision MaxInt64-1 within int64: %v", err)
	}
}

func TestDecode(t *testing.T) {
	ts := time.UnixMicro(1700000000123456).UTC()
	i64 := func(v int64) *int64 { return &v }
	str := func(s string) *string { return &s }
	led := heartbeat.Stored{Election: "e", Leader: "a", Term: 3, Revision: 9, Timestamp: ts, Value: []byte("v")}
	with := func(s heartbeat.Stored, f func(*heartbeat.Stored)) heartbeat.Stored { f(&s); return s }
	vacant := with(led, func(s *heartbeat.Stored) { s.Leader, s.Value = "", nil })
	good := []struct {
		name string
		in   heartbeat.Stored
		want heartbeat.Record
	}{
		{"a led record written before lease, successor and handover existed", led,
			heartbeat.Record{Election: "e", Leader: "a", Term: 3, Revision: 9, Timestamp: ts, Value: []byte("v")}},
		{"a led record with a lease", with(led, func(s *heartbeat.Stored) { s.LeaseMicros = i64(1500250) }),
			heartbeat.Record{Election: "e", Leader: "a", Term: 3, Revision: 9, Timestamp: ts, Value: []byte("v"), Lease: 1500250 * time.Microsecond}},
		{"a lease of MaxLease", with(led, func(s *heartbeat.Stored) { s.LeaseMicros = i64(heartbeat.MaxLeaseMicros) }),
			heartbeat.Record{Election: "e", Leader: "a", Term: 3, Revision: 9, Timestamp: ts, Value: []byte("v"), Lease: heartbeat.MaxLease}},
		{"a lease of 0", with(led, func(s *heartbeat.Stored) { s.LeaseMicros = i64(0) }),
			heartbeat.Record{Election: "e", Leader: "a", Term: 3, Revision: 9, Timestamp: ts, Value: []byte("v")}},
		{"term 0, revision 1", with(vacant, func(s *heartbeat.Stored) { s.Term, s.Revision = 0, 1 }),
			heartbeat.Record{Election: "e", Term: 0, Revision: 1, Timestamp: ts}},
		{"the largest int64 numbers", with(led, func(s *heartbeat.Stored) { s.Term, s.Revision = math.MaxInt64, math.MaxInt64 }),
			heartbeat.Record{Election: "e", Leader: "a", Term: math.MaxInt64, Revision: math.MaxInt64, Timestamp: ts, Value: []byte("v")}},
		{"an empty value reads as nil", with(led, func(s *heartbeat.Stored) { s.Value = []byte{} }),
			heartbeat.Record{Election: "e", Leader: "a", Term: 3, Revision: 9, Timestamp: ts}},
		{"an older writer's vacancy keeps the previous lease: dropped", with(vacant, func(s *heartbeat.Stored) { s.LeaseMicros = i64(1000) }),
			heartbeat.Record{Election: "e", Term: 3, Revision: 9, Timestamp: ts}},
		{"a vacancy with lease 0 and an empty successor", with(vacant, func(s *heartbeat.Stored) { s.LeaseMicros, s.Successor = i64(0), str("") }),
			heartbeat.Record{Election: "e", Term: 3, Revision: 9, Timestamp: ts}},
		{"a reserved vacancy", with(vacant, func(s *heartbeat.Stored) { s.Successor = str("b") }),
			heartbeat.Record{Election: "e", Term: 3, Revision: 9, Timestamp: ts, Successor: "b"}},
		{"an older writer's claim of a reserved vacancy keeps the successor: dropped", with(led, func(s *heartbeat.Stored) { s.Successor = str("b") }),
			heartbeat.Record{Election: "e", Leader: "a", Term: 3, Revision: 9, Timestamp: ts, Value: []byte("v")}},
		{"a led record's successor is dropped even when it is no valid name", with(led, func(s *heartbeat.Stored) { s.Successor = str("a\nb") }),
			heartbeat.Record{Election: "e", Leader: "a", Term: 3, Revision: 9, Timestamp: ts, Value: []byte("v")}},
		{"a led record with a handover token", with(led, func(s *heartbeat.Stored) { s.Handover = i64(42) }),
			heartbeat.Record{Election: "e", Leader: "a", Term: 3, Revision: 9, Timestamp: ts, Value: []byte("v"), Handover: 42}},
		{"a handover token of MaxToken", with(led, func(s *heartbeat.Stored) { s.Handover = i64(heartbeat.MaxToken) }),
			heartbeat.Record{Election: "e", Leader: "a", Term: 3, Revision: 9, Timestamp: ts, Value: []byte("v"), Handover: heartbeat.MaxToken}},
		{"a handover token of 0", with(led, func(s *heartbeat.Stored) { s.Handover = i64(0) }),
			heartbeat.Record{Election: "e", Leader: "a", Term: 3, Revision: 9, Timestamp: ts, Value: []byte("v")}},
		{"an older writer's vacancy keeps the handover token: dropped", with(vacant, func(s *heartbeat.Stored) { s.Handover = i64(42) }),
			heartbeat.Record{Election: "e", Term: 3, Revision: 9, Timestamp: ts}},
		{"an older writer's reserved vacancy keeps the handover token: dropped", with(vacant, func(s *heartbeat.Stored) { s.Successor, s.Handover = str("b"), i64(42) }),
			heartbeat.Record{Election: "e", Term: 3, Revision: 9, Timestamp: ts, Successor: "b"}},
		{"a led record with an incarnation", with(led, func(s *heartbeat.Stored) { s.Incarnation = i64(heartbeat.MaxToken) }),
			heartbeat.Record{Election: "e", Leader: "a", Term: 3, Revision: 9, Timestamp: ts, Value: []byte("v"), Incarnation: heartbeat.MaxToken}},
		{"an older writer's vacancy keeps the incarnation: dropped", with(vacant, func(s *heartbeat.Stored) { s.Incarnation = i64(42) }),
			heartbeat.Record{Election: "e", Term: 3, Revision: 9, Timestamp: ts}},
	}
	for _, c := range good {
		got, err := heartbeat.Decode(c.in)
		if err != nil || !got.Equal(c.want) {
			t.Errorf("%s: Decode = %v, %v; want %v", c.name, got, err, c.want)
		}
	}
	bad := []struct {
		name string
		in   heartbeat.Stored
		want string
	}{
		{"a negative term", with(led, func(s *heartbeat.Stored) { s.Term = -1 }), "term -1 is negative"},
		{"the smallest term", with(led, func(s *heartbeat.Stored) { s.Term = math.MinInt64 }), "is negative"},
		{"revision 0", with(led, func(s *heartbeat.Stored) { s.Revision = 0 }), "revision 0 is not positive"},
		{"a negative revision", with(led, func(s *heartbeat.Stored) { s.Revision = -5 }), "revision -5 is not positive"},
		{"a negative lease", with(led, func(s *heartbeat.Stored) { s.LeaseMicros = i64(-1) }), "lease of -1 µs is outside"},
		{"a lease over MaxLease", with(led, func(s *heartbeat.Stored) { s.LeaseMicros = i64(heartbeat.MaxLeaseMicros + 1) }), "lease of 3600000001 µs is outside"},
		{"a vacancy with a lease out of range (refused before the fix-up)", with(vacant, func(s *heartbeat.Stored) { s.LeaseMicros = i64(-1) }), "is outside"},
		{"a negative incarnation", with(led, func(s *heartbeat.Stored) { s.Incarnation = i64(-1) }), "incarnation -1 is outside"},
		{"an incarnation over MaxToken", with(vacant, func(s *heartbeat.Stored) { s.Incarnation = i64(heartbeat.MaxToken + 1) }), "incarnation 9007199254740992 is outside"},
		{"a vacancy with a value", with(vacant, func(s *heartbeat.Stored) { s.Value = []byte("v") }), "carries a value"},
		{"a leader id with a control character", with(led, func(s *heartbeat.Stored) { s.Leader = "a\x01" }), "control character"},
		{"an invalid successor of a vacancy", with(vacant, func(s *heartbeat.Stored) { s.Successor = str("b\n") }), "successor id"},
		{"a negative handover token", with(led, func(s *heartbeat.Stored) { s.Handover = i64(-1) }), "handover token -1 is outside [0, 9007199254740991]"},
		{"a handover token over MaxToken", with(led, func(s *heartbeat.Stored) { s.Handover = i64(heartbeat.MaxToken + 1) }), "handover token 9007199254740992 is outside"},
		{"the largest int64 handover token", with(led, func(s *heartbeat.Stored) { s.Handover = i64(math.MaxInt64) }), "is outside"},
		{"a vacancy with a handover token out of range (refused before the fix-up)", with(vacant, func(s *heartbeat.Stored) { s.Handover = i64(-1) }), "is outside"},
		{"a value over MaxValueLen", with(led, func(s *heartbeat.Stored) { s.Value = make([]byte, heartbeat.MaxValueLen+1) }), "exceeds MaxValueLen"},
		{"no election name", with(led, func(s *heartbeat.Stored) { s.Election = "" }), "election name is empty"},
	}
	for _, c := range bad {
		got, err := heartbeat.Decode(c.in)
		if !errors.Is(err, heartbeat.ErrInvalidRecord) || !strings.Contains(err.Error(), c.want) || !got.Equal(heartbeat.Record{}) {
			t.Errorf("%s: Decode = %v, %v; want an error matching ErrInvalidRecord saying %q", c.name, got, err, c.want)
		}
	}
}

func TestBatch(t *testing.T) {
	b := make(heartbeat.Batch)
	for i, c := range []struct {
		election string
		want     string // "" for admitted
	}{
		{"a", ""},
		{"b", ""},
		{"a", `election "a" is named by entries 0 and 2 of one batch`},
		{"", "election name is empty"},
		{"x\x00", "control character"},
		{"c", ""},
		{"b", `election "b" is named by entries 1 and 6 of one batch`},
	} {
		err := b.Add(c.election, i)
		if c.want == "" && err != nil {
			t.Errorf("entry %d (%q): %v, want admitted", i, c.election, err)
		}
		if c.want != "" && (!errors.Is(err, heartbeat.ErrInvalidRecord) || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("entry %d (%q): %v, want an error matching ErrInvalidRecord saying %q", i, c.election, err, c.want)
		}
	}
	if len(b) != 3 || b["a"] != 0 || b["b"] != 1 || b["c"] != 5 {
		t.Errorf("Batch = %v, want a:0 b:1 c:5 (the first entry of each valid election)", b)
	}
}
