package main

import (
	"bytes"
	"go/format"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The documentation checks live in this module because it is the one that
// requires every store module: a Go block of the README or docs/ may import
// any of them.

// docFiles returns the repository's README.md and every docs/*.md, read.
func docFiles(t *testing.T) map[string]string {
	t.Helper()
	names, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	names = append(names, "../../README.md")
	files := make(map[string]string, len(names))
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		files[n] = string(b)
	}
	if len(files) < 2 {
		t.Fatalf("found %d documentation files, want README.md and docs/*.md", len(files))
	}
	return files
}

var goBlock = regexp.MustCompile("(?ms)^```go\n(.*?)^```")

// TestDocsGoProgramsCompile vets every Go block of README.md and docs/*.md
// that is a whole file (starts with a package clause), and checks that it is
// gofmt'ed. The README's quick starts are such files.
func TestDocsGoProgramsCompile(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go vet on each program")
	}
	programs := 0
	for name, text := range docFiles(t) {
		for i, m := range goBlock.FindAllStringSubmatch(text, -1) {
			src := m[1]
			if !strings.HasPrefix(src, "package ") {
				continue
			}
			programs++
			formatted, err := format.Source([]byte(src))
			if err != nil {
				t.Errorf("%s: Go block %d does not parse: %v", name, i+1, err)
				continue
			}
			if !bytes.Equal(formatted, []byte(src)) {
				t.Errorf("%s: Go block %d is not gofmt'ed", name, i+1)
			}
			dir := t.TempDir()
			file := filepath.Join(dir, "main.go")
			if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
				t.Fatal(err)
			}
			// Run from this module, so the block's imports resolve to this
			// repository's packages and the versions this module requires.
			out, err := exec.Command("go", "vet", file).CombinedOutput()
			if err != nil {
				t.Errorf("%s: Go block %d does not compile: %v\n%s", name, i+1, err, out)
			}
		}
	}
	if programs < 4 {
		t.Errorf("found %d whole Go programs in the documentation, want at least 4 (the three quick starts and the stores)", programs)
	}
}

var (
	mdLink  = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	heading = regexp.MustCompile(`(?m)^#{1,6} (.*)$`)
	fenced  = regexp.MustCompile("(?ms)^```.*?^```")
)

// anchors returns the GitHub anchors of a Markdown text's headings.
func anchors(text string) map[string]bool {
	a := make(map[string]bool)
	for _, m := range heading.FindAllStringSubmatch(fenced.ReplaceAllString(text, ""), -1) {
		var b strings.Builder
		for _, r := range strings.ToLower(m[1]) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
				b.WriteRune(r)
			}
		}
		a[b.String()] = true
	}
	return a
}

// TestDocsRelativeLinks checks that every relative link of README.md and
// docs/*.md names a file or directory of the repository and, into a
// Markdown file, a heading it has.
func TestDocsRelativeLinks(t *testing.T) {
	files := docFiles(t)
	for name, text := range files {
		for _, m := range mdLink.FindAllStringSubmatch(fenced.ReplaceAllString(text, ""), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, anchor, _ := strings.Cut(target, "#")
			file := name
			if path != "" {
				file = filepath.Join(filepath.Dir(name), path)
				if _, err := os.Stat(file); err != nil {
					t.Errorf("%s: link %q: %v", name, target, err)
					continue
				}
			}
			if anchor == "" || !strings.HasSuffix(file, ".md") {
				continue
			}
			b, err := os.ReadFile(file)
			if err != nil {
				t.Errorf("%s: link %q: %v", name, target, err)
				continue
			}
			if !anchors(string(b))[anchor] {
				t.Errorf("%s: link %q: no heading with anchor #%s in %s", name, target, anchor, file)
			}
		}
	}
}
