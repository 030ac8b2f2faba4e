package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestFairFlag runs reqlock in fair mode on the hot and multi workloads (the
// flag reaches the children) and checks what every run must show.
func TestFairFlag(t *testing.T) {
	jsonPath := filepath.Join(t.TempDir(), "results.json")
	var stdout, stderr bytes.Buffer
	args := []string{"-redis", redisAddr, "-duration", "300ms", "-wait", "2s", "-waiters", "8",
		"-procs", "2", "-lib", "reqlock", "-workload", "hot,multi", "-fair", "-json", jsonPath}
	if code := run(t.Context(), args, strings.NewReader(""), &stdout, &stderr); code != 0 {
		t.Fatalf("exit code %d; stderr:\n%s", code, &stderr)
	}
	if !strings.Contains(stdout.String(), "WithFairness") {
		t.Errorf("the settings do not say fair mode:\n%s", &stdout)
	}
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var rep report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if !rep.Config.Fair || len(rep.Results) != 2 {
		t.Fatalf("config fair %v, %d results", rep.Config.Fair, len(rep.Results))
	}
	for _, r := range rep.Results {
		if r.Acquisitions <= 0 || r.LostUpdates != 0 || r.Errors+r.ReleaseErrors+r.RMWErrors != 0 {
			t.Errorf("%s: %d acquisitions, %d lost, %d/%d/%d errors; first: %s", r.Workload,
				r.Acquisitions, r.LostUpdates, r.Errors, r.ReleaseErrors, r.RMWErrors, r.FirstError)
		}
	}
	// The fair queues emptied and expired with the run.
	c := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer c.Close()
	keys, _, err := c.Scan(t.Context(), 0, "*lockbench:"+rep.Environment.RunID+":*", 10000).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) > 0 {
		t.Errorf("keys left behind: %q", keys)
	}
}
