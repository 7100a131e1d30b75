package integration

import (
	"strings"
	"testing"
	"time"
)

const ms = int64(time.Millisecond)

func el(t int64, term uint64) Line { return Line{Mono: t * ms, Kind: KindElected, Term: term} }
func un(t int64, term uint64, reason string) Line {
	return Line{Mono: t * ms, Kind: KindUnelected, Term: term, Reason: reason}
}
func act(term uint64, first, last int64) Line {
	return Line{Mono: last * ms, Kind: KindAct, Term: term, First: first * ms, Last: last * ms, Count: 2}
}

func TestParseLineRoundTrip(t *testing.T) {
	for _, l := range []Line{
		{Mono: 12, Node: "n1", Kind: KindElected, Term: 3},
		{Mono: 13, Node: "n1", Kind: KindUnelected, Term: 3, Reason: "lease-expired"},
		{Mono: 14, Node: "n2", Kind: KindNewLeader, Leader: "n1", Term: 3},
		{Mono: 15, Node: "n2", Kind: KindNewLeader, Term: 4},
		{Mono: 16, Node: "n1", Kind: KindAct, Term: 3, First: 12, Last: 13, Count: 7},
		{Mono: 17, Node: "n1", Kind: KindFence, Term: 3, Count: 40, Refused: 2, Cancelled: 1, Errors: 1},
		{Mono: 17, Node: "n1", Kind: KindSubStarted},
	} {
		got, ok, err := ParseLine(l.String())
		if !ok || err != nil || got != l {
			t.Errorf("ParseLine(%q) = %+v, %v, %v; want %+v", l.String(), got, ok, err, l)
		}
	}
	if _, ok, _ := ParseLine("panic: something"); ok {
		t.Error("a line without the LF prefix was taken for a log line")
	}
	for _, bad := range []string{"LF x n1 elected 1", "LF 1 n1 elected", "LF 1 n1 act 1 2 3", "LF 1 n1 elected -1"} {
		if _, ok, err := ParseLine(bad); !ok || err == nil {
			t.Errorf("ParseLine(%q): want an error", bad)
		}
	}
}

// The checker must pass correct logs and catch every kind of violation,
// naming the intervals involved.
func TestCheck(t *testing.T) {
	clean := []NodeLog{
		{Proc: "n1#1", End: 1000 * ms, Lines: []Line{el(100, 1), act(1, 101, 190), un(200, 1, "lease-expired")}},
		{Proc: "n2#1", End: 1000 * ms, Lines: []Line{el(450, 2), act(2, 451, 600), un(600, 2, "stopped")}},
	}
	kill := Fault{Kind: "kill", Seq: 1, Victim: "n1#1", At: 150 * ms, NewLeader: true}
	tests := []struct {
		name  string
		logs  []NodeLog
		fault Fault
		want  []string // substrings of the error; none: no error
	}{
		{name: "clean", logs: clean, fault: kill},
		{
			name: "overlap",
			logs: []NodeLog{
				{Proc: "n1#1", End: 1000 * ms, Lines: []Line{el(100, 1), un(300, 1, "deposed")}},
				{Proc: "n2#1", End: 1000 * ms, Lines: []Line{el(250, 2), un(400, 2, "stopped")}},
			},
			fault: kill,
			want:  []string{"overlapping leadership", "n1#1 term 1 [0.100000, 0.300000]", "overlaps n2#1 term 2 [0.250000, 0.400000]", "by 50ms"},
		},
		{
			name: "ended leader overlaps",
			logs: []NodeLog{
				{Proc: "n1#1", End: 500 * ms, Lines: []Line{el(100, 1)}},
				{Proc: "n2#1", End: 1000 * ms, Lines: []Line{el(450, 2), un(600, 2, "stopped")}},
			},
			fault: kill,
			want:  []string{"overlapping leadership", "process-ended"},
		},
		{
			name: "killed leader ends at the kill, not when its end was noticed",
			logs: []NodeLog{
				{Proc: "n1#1", End: 900 * ms, Killed: 150 * ms, Lines: []Line{el(100, 1)}},
				{Proc: "n2#1", End: 1000 * ms, Lines: []Line{el(450, 2), un(600, 2, "stopped")}},
			},
			fault: kill,
		},
		{
			name: "killed leader overlaps",
			logs: []NodeLog{
				{Proc: "n1#1", End: 900 * ms, Killed: 500 * ms, Lines: []Line{el(100, 1)}},
				{Proc: "n2#1", End: 1000 * ms, Lines: []Line{el(450, 2), un(600, 2, "stopped")}},
			},
			fault: kill,
			want:  []string{"overlapping leadership", "n1#1 term 1 [0.100000, 0.500000]", "ended: killed", "by 50ms"},
		},
		{
			name: "term not increasing",
			logs: []NodeLog{
				{Proc: "n1#1", End: 1000 * ms, Lines: []Line{el(100, 2), un(200, 2, "stopped")}},
				{Proc: "n2#1", End: 1000 * ms, Lines: []Line{el(450, 2), un(600, 2, "stopped")}},
			},
			fault: kill,
			want:  []string{"terms not increasing"},
		},
		{
			name: "acted after the lease",
			logs: []NodeLog{
				{Proc: "n1#1", End: 1000 * ms, Lines: []Line{el(100, 1), act(1, 101, 230), un(200, 1, "lease-expired")}},
				{Proc: "n2#1", End: 1000 * ms, Lines: []Line{el(450, 2), un(600, 2, "stopped")}},
			},
			fault: kill,
			want:  []string{"acted as leader outside its leadership", "30ms after its term ended"},
		},
		{
			name: "acted for a term it never won",
			logs: []NodeLog{
				{Proc: "n1#1", End: 1000 * ms, Lines: []Line{act(7, 101, 130)}},
				{Proc: "n2#1", End: 1000 * ms, Lines: []Line{el(450, 2), un(600, 2, "stopped")}},
			},
			fault: kill,
			want:  []string{"never won"},
		},
		{
			name:  "no leader within the bound",
			logs:  clean,
			fault: Fault{Kind: "kill", Seq: 1, Victim: "n1#1", At: 150 * ms, NewLeader: true},
			want:  []string{"no leader within the bound", "after 300ms (bound 250ms)"},
		},
		{
			name:  "no leader at all",
			logs:  clean,
			fault: Fault{Kind: "cut", Seq: 1, Victim: "n2#1", At: 700 * ms, NewLeader: true},
			want:  []string{"no leader afterwards"},
		},
		{
			name: "stopped leader past its lease",
			logs: []NodeLog{
				{Proc: "n1#1", End: 1000 * ms, Lines: []Line{el(100, 1), un(320, 1, "lease-expired")}},
				{Proc: "n2#1", End: 1000 * ms, Lines: []Line{el(450, 2), un(600, 2, "stopped")}},
			},
			fault: Fault{Kind: "stop", Seq: 1, Victim: "n1#1", At: 150 * ms, NewLeader: true, LeaseEndBy: 300 * ms},
			want:  []string{"led past its lease", "20ms after its lease must have"},
		},
		{
			name: "unelected without elected",
			logs: []NodeLog{{Proc: "n1#1", End: 1000 * ms, Lines: []Line{un(200, 1, "stopped")}}},
			want: []string{"malformed log"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var faults []Fault
			if tt.fault.Kind != "" {
				faults = []Fault{tt.fault}
			}
			bound := 400 * time.Millisecond
			if tt.name == "no leader within the bound" {
				bound = 250 * time.Millisecond
			}
			err := Check(tt.logs, faults, bound).Err()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("want no violation, got %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("want a violation (%q), got none", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
		})
	}
}

// A fault the leader survives needs no new election: a leader at Ref is
// enough; otherwise the first term that starts after Ref counts.
func TestCheckTimeToLeader(t *testing.T) {
	logs := []NodeLog{
		{Proc: "n1#1", End: 2000 * ms, Lines: []Line{el(100, 1), un(500, 1, "lease-expired"), el(900, 3), un(1000, 3, "stopped")}},
		{Proc: "n2#1", End: 2000 * ms, Lines: []Line{el(700, 2), un(800, 2, "resigned")}},
	}
	faults := []Fault{
		{Kind: "feedkill", Seq: 1, At: 200 * ms, Ref: 200 * ms},
		{Kind: "restart", Seq: 2, At: 400 * ms, Ref: 600 * ms},
		{Kind: "kill", Seq: 3, At: 750 * ms, NewLeader: true},
	}
	r := Check(logs, faults, time.Second)
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{0, 100 * time.Millisecond, 150 * time.Millisecond}
	for i, w := range want {
		if r.TimeToLeader[i] != w {
			t.Errorf("fault %d: time to leader %v, want %v", i+1, r.TimeToLeader[i], w)
		}
	}
	table := r.Summary(faults, []string{"kill", "feedkill", "restart"})
	for _, w := range []string{"| kill | 1 | 0 | 0 | 150ms | 150ms | 150ms |", "| **all** | 3 | 0 | 0 | 100ms | 150ms | 150ms |"} {
		if !strings.Contains(table, w) {
			t.Errorf("summary lacks %q:\n%s", w, table)
		}
	}
}

// After a database failover the time to leader counts from the kill of the
// primary (Since), while the bound counts from when the store took writes
// again (Ref): the database's own failover time is not the election's.
func TestCheckTimeToLeaderSince(t *testing.T) {
	failover := Fault{Kind: "failover", Seq: 1, At: 150 * ms, Since: 150 * ms, Ref: 1200 * ms}
	for _, tt := range []struct {
		name  string
		next  []Line // of n2
		bound time.Duration
		ttl   time.Duration
		err   string
	}{
		{"elected after Ref", []Line{el(1500, 2), un(1600, 2, "stopped")}, time.Second, 1350 * time.Millisecond, ""},
		{"elected between Since and Ref", []Line{el(1000, 2), un(1600, 2, "stopped")}, time.Second, 850 * time.Millisecond, ""},
		{"elected and unelected between Since and Ref", []Line{el(1000, 2), un(1100, 2, "lease-expired")}, time.Second, 850 * time.Millisecond, ""},
		{"bound counts from Ref", []Line{el(1500, 2), un(1600, 2, "stopped")}, 250 * time.Millisecond, 1350 * time.Millisecond, "a leader only after 300ms (bound 250ms)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			logs := []NodeLog{
				{Proc: "n1#1", End: 2000 * ms, Lines: []Line{el(100, 1), un(200, 1, "lease-expired")}},
				{Proc: "n2#1", End: 2000 * ms, Lines: tt.next},
			}
			r := Check(logs, []Fault{failover}, tt.bound)
			if got := r.TimeToLeader[0]; got != tt.ttl {
				t.Errorf("time to leader %v, want %v", got, tt.ttl)
			}
			err := r.Err()
			switch {
			case tt.err == "" && err != nil:
				t.Errorf("want no violation, got %v", err)
			case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
				t.Errorf("want %q, got %v", tt.err, err)
			}
		})
	}
}
