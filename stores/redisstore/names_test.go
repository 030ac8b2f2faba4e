package redisstore

import (
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestSiblingNames checks that the names the single-key acquire and release
// build in one allocation are those of fenceKey, waitingKey, abandonKey,
// writerMarkKey and writersKey.
func TestSiblingNames(t *testing.T) {
	const token = "tok_en-0123456789abcdef"
	for _, key := range []string{"reqlock:sku:42", "reqlock:{sku:42}", "a{b", "x{}{y}", "a}b{c}", "ключ:😀", ""} {
		got := siblingNames([]string{key}, key, token, ":fence", ":waiting", ":abandoned:", ":writer:", ":writers")
		want := []string{key, fenceKey(key), waitingKey(key), abandonKey(key, token), writerMarkKey(key, token), writersKey(key)}
		if !slices.Equal(got, want) {
			t.Errorf("siblingNames(%q) = %q, want %q", key, got, want)
		}
	}
}

// TestScriptHelpers checks that every script defines each helper of
// lib.lua, internal/redislua and grant_lib.lua it calls, before its body,
// and no other: withLib prepends only those, since Redis makes a closure of
// each on every call.
func TestScriptHelpers(t *testing.T) {
	if len(helpers) < 10 {
		t.Fatalf("parsed %d helpers from lib.lua, writers.lua and grant_lib.lua, want the 12 or so there are", len(helpers))
	}
	defined := regexp.MustCompile(`(?m)^local function (\w+)\(`)
	for _, script := range allScripts() {
		src := script.Source()
		var names []string
		for _, m := range defined.FindAllStringSubmatch(src, -1) {
			names = append(names, m[1])
		}
		for _, h := range helpers {
			called := false
			for _, line := range strings.Split(src, "\n") {
				code, _, _ := strings.Cut(line, "--")
				if strings.HasPrefix(code, "local function "+h.name+"(") {
					continue
				}
				called = called || h.call.MatchString(code)
			}
			if def := slices.Contains(names, h.name); called != def {
				t.Errorf("script %.60q...: helper %s called %v, defined %v", src, h.name, called, def)
			}
		}
	}
	// The single-key acquire and release, the hot path, in particular.
	for _, tc := range []struct {
		script *Script
		want   []string
	}{
		{acquireScript, []string{"now_us", "issue_fence", "own_retry", "refuse_abandoned", "mark_waiting", "check_marks",
			"held_shared", "writer_waits", "writer_granted", "acquire_key"}},
		{releaseScript, []string{"now_us", "writer_withdraws"}},
	} {
		var got []string
		for _, m := range defined.FindAllStringSubmatch(tc.script.Source(), -1) {
			got = append(got, m[1])
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("helpers defined: %q, want %q", got, tc.want)
		}
	}
}
