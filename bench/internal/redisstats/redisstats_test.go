package redisstats

import (
	"maps"
	"strings"
	"testing"
	"time"
)

// info is INFO commandstats as Redis 7.0 prints it (CRLF line ends), with a
// subcommand, a rejected call, and a script's own commands.
const info = "# Commandstats\r\n" +
	"cmdstat_ping:calls=1,usec=30,usec_per_call=30.00,rejected_calls=0,failed_calls=0\r\n" +
	"cmdstat_set:calls=21001,usec=35327,usec_per_call=1.68,rejected_calls=2,failed_calls=1\r\n" +
	"cmdstat_client|setinfo:calls=4,usec=9,usec_per_call=2.25,rejected_calls=0,failed_calls=0\r\n" +
	"cmdstat_eval:calls=1,usec=459,usec_per_call=459.00,rejected_calls=0,failed_calls=0\r\n" +
	"cmdstat_evalsha:calls=40000,usec=346480,usec_per_call=8.66,rejected_calls=0,failed_calls=0\r\n" +
	"cmdstat_get:calls=20000,usec=8174,usec_per_call=0.41\r\n"

func TestParseCommandStats(t *testing.T) {
	got, err := ParseCommandStats(info)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{
		"ping": 1, "ping usec": 30,
		"set": 21003, "set usec": 35327, // calls plus rejected_calls; failed_calls are among calls
		"client|setinfo": 4, "client|setinfo usec": 9,
		"eval": 1, "eval usec": 459,
		"evalsha": 40000, "evalsha usec": 346480,
		"get": 20000, "get usec": 8174, // before Redis 6.2: no rejected_calls
	}
	if !maps.Equal(got, want) {
		t.Errorf("ParseCommandStats =\n%v\nwant\n%v", got, want)
	}
}

func TestParseCommandStatsRefuses(t *testing.T) {
	for _, tc := range []struct{ text, want string }{
		{info + "cmdstat_get:calls=1,usec=1\r\n", "get on two lines"},
		{"cmdstat_get:calls=x,usec=1\r\n", `"cmdstat_get:calls=x,usec=1"`},
	} {
		if _, err := ParseCommandStats(tc.text); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseCommandStats(%q): error %v, want one with %q", tc.text, err, tc.want)
		}
	}
}

func TestDeltaAndScripts(t *testing.T) {
	before, err := ParseCommandStats(info)
	if err != nil {
		t.Fatal(err)
	}
	after, err := ParseCommandStats(strings.NewReplacer(
		"cmdstat_ping:calls=1,usec=30", "cmdstat_ping:calls=2,usec=35",
		"cmdstat_evalsha:calls=40000,usec=346480", "cmdstat_evalsha:calls=40010,usec=346580",
		"cmdstat_get:calls=20000,usec=8174", "cmdstat_get:calls=20020,usec=8184",
	).Replace(info) + "cmdstat_info:calls=1,usec=200\r\ncmdstat_eval_ro:calls=3,usec=7\r\n")
	if err != nil {
		t.Fatal(err)
	}
	d := Delta(before, after)
	want := map[string]int64{
		"ping": 1, "ping usec": 5,
		"evalsha": 10, "evalsha usec": 100,
		"get": 20, "get usec": 10,
		"info": 1, "info usec": 200,
		"eval_ro": 3, "eval_ro usec": 7,
	}
	if !maps.Equal(d, want) {
		t.Fatalf("Delta =\n%v\nwant\n%v", d, want)
	}
	if got := ScriptCalls(d); got != 13 {
		t.Errorf("ScriptCalls = %d, want 13", got)
	}
	if got := ScriptMicros(d); got != 107 {
		t.Errorf("ScriptMicros = %d, want 107", got)
	}
	delete(want, "ping")
	delete(want, "ping usec")
	delete(want, "info")
	delete(want, "info usec")
	if got := WithoutOverhead(d); !maps.Equal(got, want) {
		t.Errorf("WithoutOverhead =\n%v\nwant\n%v", got, want)
	}
}

func TestIsOverhead(t *testing.T) {
	for _, c := range []string{"hello", "auth", "select", "info", "client", "client|setinfo", "ping"} {
		if !IsOverhead(c) {
			t.Errorf("IsOverhead(%q) = false", c)
		}
	}
	for _, c := range []string{"evalsha", "eval", "get", "set", "del", "clientx", UsecKey("ping")} {
		if IsOverhead(c) {
			t.Errorf("IsOverhead(%q) = true", c)
		}
	}
}

// TestParseServerCPU: user plus system CPU of INFO cpu as Redis 7.0 prints
// it; an answer without them is an error.
func TestParseServerCPU(t *testing.T) {
	got, err := ParseServerCPU("# CPU\r\nused_cpu_sys:1.250000\r\nused_cpu_user:2.500500\r\n" +
		"used_cpu_sys_children:9.000000\r\nused_cpu_user_children:9.000000\r\nused_cpu_sys_main_thread:1.000000\r\n")
	if want := 3750500 * time.Microsecond; err != nil || got != want {
		t.Errorf("got %v, %v; want %v", got, err, want)
	}
	if _, err := ParseServerCPU("# CPU\r\n"); err == nil {
		t.Error("an answer without used_cpu_*: no error")
	}
	if _, err := ParseServerCPU("used_cpu_sys:x\r\n"); err == nil {
		t.Error("used_cpu_sys:x: no error")
	}
}
