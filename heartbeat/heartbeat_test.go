package heartbeat_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/leaderfeed/leaderfeed/heartbeat"
)

func TestDefaults(t *testing.T) {
	d := heartbeat.DefaultTiming()
	want := heartbeat.Timing{
		HeartbeatInterval:  time.Second,
		ElectionTimeoutMin: 2 * time.Second,
		ElectionTimeoutMax: 4 * time.Second,
		LeaseDuration:      1500 * time.Millisecond,
	}
	if d != want {
		t.Fatalf("DefaultTiming() = %+v, want %+v", d, want)
	}
	if err := d.Validate(); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
	// A lease derived from shrunk timings stays between heartbeat and timeout.
	small := heartbeat.Timing{HeartbeatInterval: 10 * time.Millisecond, ElectionTimeoutMin: 50 * time.Millisecond}.WithDefaults()
	if small.LeaseDuration != 30*time.Millisecond || small.ElectionTimeoutMax != 4*time.Second || small.VacancyJitter != 0 {
		t.Fatalf("derived %+v", small)
	}
	if err := small.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestValidateNamesTheFields(t *testing.T) {
	ms := time.Millisecond
	cases := []struct {
		name   string
		timing heartbeat.Timing
		want   []string
	}{
		{"zero", heartbeat.Timing{}, []string{"HeartbeatInterval must be positive, got 0s", "ElectionTimeoutMin must be positive", "ElectionTimeoutMax must be positive", "LeaseDuration must be positive"}},
		{"negative", heartbeat.Timing{HeartbeatInterval: -ms, ElectionTimeoutMin: 3 * ms, ElectionTimeoutMax: 4 * ms, LeaseDuration: 2 * ms}, []string{"HeartbeatInterval must be positive, got -1ms"}},
		{"timeout min <= heartbeat", heartbeat.Timing{HeartbeatInterval: 10 * ms, ElectionTimeoutMin: 10 * ms, ElectionTimeoutMax: 20 * ms, LeaseDuration: 5 * ms}, []string{"ElectionTimeoutMin (10ms) must be greater than HeartbeatInterval (10ms)"}},
		{"max < min", heartbeat.Timing{HeartbeatInterval: 10 * ms, ElectionTimeoutMin: 50 * ms, ElectionTimeoutMax: 40 * ms, LeaseDuration: 20 * ms}, []string{"ElectionTimeoutMax (40ms) must not be less than ElectionTimeoutMin (50ms)"}},
		{"lease >= min", heartbeat.Timing{HeartbeatInterval: 10 * ms, ElectionTimeoutMin: 50 * ms, ElectionTimeoutMax: 60 * ms, LeaseDuration: 50 * ms}, []string{"LeaseDuration (50ms) must be less than ElectionTimeoutMin (50ms)"}},
		{"lease <= heartbeat", heartbeat.Timing{HeartbeatInterval: 10 * ms, ElectionTimeoutMin: 50 * ms, ElectionTimeoutMax: 60 * ms, LeaseDuration: 10 * ms}, []string{"LeaseDuration (10ms) must be greater than HeartbeatInterval (10ms)"}},
		{"negative jitter", heartbeat.Timing{HeartbeatInterval: 10 * ms, ElectionTimeoutMin: 50 * ms, ElectionTimeoutMax: 60 * ms, LeaseDuration: 20 * ms, VacancyJitter: -ms}, []string{"VacancyJitter must not be negative"}},
		{"jitter >= heartbeat", heartbeat.Timing{HeartbeatInterval: 10 * ms, ElectionTimeoutMin: 50 * ms, ElectionTimeoutMax: 60 * ms, LeaseDuration: 20 * ms, VacancyJitter: 10 * ms}, []string{"VacancyJitter (10ms) must be less than HeartbeatInterval (10ms)"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.timing.Validate()
			if !errors.Is(err, heartbeat.ErrInvalidTiming) {
				t.Fatalf("Validate() = %v, want an error matching ErrInvalidTiming", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

func TestRandomizedDurationsStayInBounds(t *testing.T) {
	tm := heartbeat.Timing{HeartbeatInterval: 10 * time.Millisecond, ElectionTimeoutMin: 100 * time.Millisecond, ElectionTimeoutMax: 200 * time.Millisecond, VacancyJitter: time.Millisecond}.WithDefaults()
	r := rand.New(rand.NewPCG(1, 2))
	var lo, hi bool
	for range 10000 {
		d := tm.ElectionTimeout(r)
		if d < tm.ElectionTimeoutMin || d > tm.ElectionTimeoutMax {
			t.Fatalf("ElectionTimeout() = %v, outside [%v, %v]", d, tm.ElectionTimeoutMin, tm.ElectionTimeoutMax)
		}
		lo = lo || d < 110*time.Millisecond
		hi = hi || d > 190*time.Millisecond
		if j := tm.Jitter(nil); j < 0 || j > tm.VacancyJitter {
			t.Fatalf("Jitter() = %v, outside [0, %v]", j, tm.VacancyJitter)
		}
	}
	if !lo || !hi {
		t.Fatalf("10000 draws did not reach both ends of the range (low %v, high %v)", lo, hi)
	}
	// A seeded source gives the same sequence: tests can rely on it.
	a, b := rand.New(rand.NewPCG(7, 7)), rand.New(rand.NewPCG(7, 7))
	if tm.ElectionTimeout(a) != tm.ElectionTimeout(b) {
		t.Fatal("the same seed gave different timeouts")
	}
}

func TestRecordValidate(t *testing.T) {
	long := strings.Repeat("x", heartbeat.MaxNameLen+1)
	cases := []struct {
		name string
		rec  heartbeat.Record
		want string // "" means valid
	}{
		{"valid", heartbeat.Record{Election: "e", Leader: "n", Term: 1, Revision: 1, Value: []byte("v")}, ""},
		{"vacant", heartbeat.Record{Election: "e", Term: 3, Revision: 4}, ""},
		{"empty election", heartbeat.Record{Leader: "n"}, "election name is empty"},
		{"long election", heartbeat.Record{Election: long}, "election name is 128 bytes long"},
		{"control character in leader", heartbeat.Record{Election: "e", Leader: "a\x00b"}, "leader id \"a\\x00b\" contains a control character"},
		{"invalid UTF-8", heartbeat.Record{Election: "e", Leader: "\xff"}, "not valid UTF-8"},
		{"value on vacant record", heartbeat.Record{Election: "e", Value: []byte("v")}, "vacant record of election \"e\" carries a value"},
		{"value too large", heartbeat.Record{Election: "e", Leader: "n", Value: make([]byte, heartbeat.MaxValueLen+1)}, "exceeds MaxValueLen"},
		{"lease", heartbeat.Record{Election: "e", Leader: "n", Lease: time.Second}, ""},
		{"negative lease", heartbeat.Record{Election: "e", Leader: "n", Lease: -1}, "lease -1ns of election \"e\" is negative"},
		{"lease too long", heartbeat.Record{Election: "e", Leader: "n", Lease: heartbeat.MaxLease + 1}, "exceeds MaxLease"},
		{"lease on vacant record", heartbeat.Record{Election: "e", Lease: time.Second}, "vacant record of election \"e\" carries a lease"},
		{"reserved vacancy", heartbeat.Record{Election: "e", Successor: "n"}, ""},
		{"successor on a led record", heartbeat.Record{Election: "e", Leader: "n", Successor: "m"}, "only a vacant record is reserved"},
		{"successor with a control character", heartbeat.Record{Election: "e", Successor: "a\nb"}, "successor id"},
		{"successor too long", heartbeat.Record{Election: "e", Successor: strings.Repeat("x", heartbeat.MaxNameLen+1)}, "successor id is 128 bytes long"},
		{"handover on a led record", heartbeat.Record{Election: "e", Leader: "n", Term: 2, Lease: time.Second, Handover: 7}, ""},
		{"handover of MaxToken", heartbeat.Record{Election: "e", Leader: "n", Handover: heartbeat.MaxToken}, ""},
		{"handover over MaxToken", heartbeat.Record{Election: "e", Leader: "n", Handover: heartbeat.MaxToken + 1}, "handover token 9007199254740992 of election \"e\" exceeds MaxToken"},
		{"handover of the largest uint64", heartbeat.Record{Election: "e", Leader: "n", Handover: math.MaxUint64}, "exceeds MaxToken"},
		{"handover on a vacant record", heartbeat.Record{Election: "e", Handover: 7}, "vacant record of election \"e\" carries a handover token"},
		{"handover on a reserved vacancy", heartbeat.Record{Election: "e", Successor: "n", Handover: 7}, "carries a handover token"},
		{"incarnation of MaxToken", heartbeat.Record{Election: "e", Leader: "n", Incarnation: heartbeat.MaxToken}, ""},
		{"incarnation over MaxToken", heartbeat.Record{Election: "e", Leader: "n", Incarnation: heartbeat.MaxToken + 1}, "incarnation 9007199254740992 of election \"e\" exceeds MaxToken"},
		{"incarnation on a vacant record", heartbeat.Record{Election: "e", Incarnation: 7}, "vacant record of election \"e\" carries an incarnation"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.rec.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, heartbeat.ErrInvalidRecord) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want an ErrInvalidRecord saying %q", err, tc.want)
			}
		})
	}
}

func TestRecordCloneAndEqual(t *testing.T) {
	r := heartbeat.Record{Election: "e", Leader: "n", Term: 2, Revision: 5, Timestamp: time.Unix(10, 0), Value: []byte("abc")}
	c := r.Clone()
	c.Value[0] = 'X'
	if r.Value[0] != 'a' {
		t.Fatal("Clone shares Value with the original")
	}
	if r.Equal(c) {
		t.Fatal("Equal ignores Value")
	}
	c.Value[0] = 'a'
	if !r.Equal(c) {
		t.Fatal("equal records are not Equal")
	}
	if got := r.String(); got != "e: leader=n term=2 rev=5" {
		t.Fatalf("String() = %q", got)
	}
	c.Handover = 7
	if r.Equal(c) {
		t.Fatal("Equal ignores Handover")
	}
	d := r
	d.Incarnation = 7
	if r.Equal(d) {
		t.Fatal("Equal ignores Incarnation")
	}
	if got := c.String(); !strings.Contains(got, "handover=7") {
		t.Fatalf("String() of a handover = %q", got)
	}
	d.Lease = time.Second
	if got := d.String(); got != "e: leader=n term=2 rev=5 lease=1s incarnation=7" {
		t.Fatalf("String() of a record with an incarnation = %q", got)
	}
	if got := (heartbeat.Record{Election: "e"}).String(); !strings.Contains(got, "<vacant>") {
		t.Fatalf("String() of a vacant record = %q", got)
	}
}

// Issue 12, fault 10: sub-millisecond durations and a margin under 10 % of
// ElectionTimeoutMin were accepted.
func TestValidateRejectsTinyDurationsAndMargins(t *testing.T) {
	cases := map[string]heartbeat.Timing{
		"nanoseconds":  {HeartbeatInterval: 10, LeaseDuration: 20, ElectionTimeoutMin: 100, ElectionTimeoutMax: 200},
		"tiny margin":  {HeartbeatInterval: 10 * time.Millisecond, LeaseDuration: 99 * time.Millisecond, ElectionTimeoutMin: 100 * time.Millisecond, ElectionTimeoutMax: 200 * time.Millisecond},
		"margin of 9%": {HeartbeatInterval: 10 * time.Millisecond, LeaseDuration: 91 * time.Millisecond, ElectionTimeoutMin: 100 * time.Millisecond, ElectionTimeoutMax: 200 * time.Millisecond},
	}
	for name, tm := range cases {
		if err := tm.Validate(); !errors.Is(err, heartbeat.ErrInvalidTiming) {
			t.Errorf("%s: Validate = %v, want ErrInvalidTiming", name, err)
		}
	}
	ok := heartbeat.Timing{HeartbeatInterval: 10 * time.Millisecond, LeaseDuration: 90 * time.Millisecond, ElectionTimeoutMin: 100 * time.Millisecond, ElectionTimeoutMax: 200 * time.Millisecond}
	if err := ok.Validate(); err != nil {
		t.Errorf("a margin of exactly 10%%: %v", err)
	}
	if err := heartbeat.DefaultTiming().Validate(); err != nil {
		t.Errorf("default timing: %v", err)
	}
}

func TestTimingFor(t *testing.T) {
	for _, d := range []time.Duration{10 * time.Millisecond, 500 * time.Millisecond, 3 * time.Second, time.Minute} {
		tm, err := heartbeat.TimingFor(d)
		if err != nil {
			t.Fatalf("TimingFor(%v): %v", d, err)
		}
		if tm.ElectionTimeoutMax > d || tm.LeaseDuration >= tm.ElectionTimeoutMin {
			t.Fatalf("TimingFor(%v) = %+v", d, tm)
		}
		// Half the bound is left for the claim: four failed claims,
		// each retried a heartbeat later, still fit.
		if tm.ElectionTimeoutMax+4*tm.HeartbeatInterval > d {
			t.Errorf("TimingFor(%v) = %+v: ElectionTimeoutMax + 4 heartbeats exceeds the bound", d, tm)
		}
		// The typical failover after a crash (a random point between
		// heartbeats, the middle of the range) is under 42 % of the bound.
		if typical := (tm.ElectionTimeoutMin+tm.ElectionTimeoutMax)/2 - tm.HeartbeatInterval/2; typical > d*42/100 {
			t.Errorf("TimingFor(%v) = %+v: typical failover %v is over 42 %% of the bound", d, tm, typical)
		}
		if w := heartbeat.FollowerWait(tm.LeaseDuration); w > tm.ElectionTimeoutMin {
			t.Errorf("TimingFor(%v) = %+v: FollowerWait of its lease %v exceeds ElectionTimeoutMin", d, tm, w)
		}
	}
	if _, err := heartbeat.TimingFor(time.Millisecond); !errors.Is(err, heartbeat.ErrInvalidTiming) {
		t.Fatalf("TimingFor(1ms): %v, want ErrInvalidTiming", err)
	}
}

func TestFollowerWaitKeepsTheMargin(t *testing.T) {
	if got := heartbeat.FollowerWait(0); got != 0 {
		t.Fatalf("FollowerWait(0) = %v, want 0", got)
	}
	for _, lease := range []time.Duration{1, 9, 10, time.Millisecond, 1500 * time.Millisecond, heartbeat.MaxLease} {
		w := heartbeat.FollowerWait(lease)
		if w <= lease || w-lease < w/heartbeat.MarginDivisor {
			t.Errorf("FollowerWait(%v) = %v: margin %v is less than a tenth of it", lease, w, w-lease)
		}
		// A Timing whose ElectionTimeoutMin is that wait passes Validate's
		// margin rule: homogeneous timings never wait longer than before.
		if lease >= heartbeat.MinDuration {
			tm := heartbeat.Timing{HeartbeatInterval: lease / 2, LeaseDuration: lease, ElectionTimeoutMin: w, ElectionTimeoutMax: w}
			if err := tm.Validate(); err != nil && strings.Contains(err.Error(), "tenth") {
				t.Errorf("ElectionTimeoutMin = FollowerWait(%v) = %v fails the margin rule: %v", lease, w, err)
			}
		}
	}
	tm := heartbeat.DefaultTiming()
	if w := heartbeat.FollowerWait(tm.LeaseDuration); w > tm.ElectionTimeoutMin {
		t.Errorf("default timing: FollowerWait(%v) = %v exceeds ElectionTimeoutMin %v", tm.LeaseDuration, w, tm.ElectionTimeoutMin)
	}
}

func TestSameWrite(t *testing.T) {
	r := heartbeat.Record{Election: "e", Leader: "a", Term: 3, Revision: 5, Value: []byte("x")}
	if !r.SameWrite(heartbeat.Record{Election: "e", Leader: "a", Term: 3, Revision: 5}) {
		t.Error("records of one revision, leader and term are not the same write")
	}
	for _, o := range []heartbeat.Record{
		{Election: "e", Leader: "b", Term: 3, Revision: 5},
		{Election: "e", Leader: "a", Term: 4, Revision: 5},
		{Election: "e", Leader: "a", Term: 3, Revision: 6},
	} {
		if r.SameWrite(o) {
			t.Errorf("%v and %v taken for the same write", r, o)
		}
	}
}
