package main

import (
	"cmp"
	"fmt"
	"go/format"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
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

// repoRoot is the repository's root, absolute.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// docBlocks returns the code blocks of README.md and docs/*.md, sorted by
// file and line, and the problems of their directives.
func docBlocks(t *testing.T) ([]docBlock, []string) {
	t.Helper()
	var blocks []docBlock
	var problems []string
	for name, text := range docFiles(t) {
		b, p := codeBlocks(strings.TrimPrefix(name, "../../"), text)
		blocks = append(blocks, b...)
		problems = append(problems, p...)
	}
	slices.SortFunc(blocks, func(a, b docBlock) int {
		return cmp.Or(strings.Compare(a.file, b.file), a.fenceLine-b.fenceLine)
	})
	slices.Sort(problems)
	return blocks, problems
}

// TestDocsCodeBlocksLabelled checks that every code block of README.md and
// docs/*.md names its language (```text for output and listings), that
// none but ```go blocks hold Go, and the go: directives (codeBlocks). Only
// ```go blocks are compiled, so Go under another label would go unchecked.
func TestDocsCodeBlocksLabelled(t *testing.T) {
	blocks, problems := docBlocks(t)
	for _, p := range problems {
		t.Error(p)
	}
	for _, b := range blocks {
		switch {
		case b.lang == "":
			t.Errorf("%s: a code block without a language: fence it as ```go, ```sh, ```yaml, ```text, ...", b.where())
		case b.lang != "go" && looksLikeGo(b.src):
			t.Errorf("%s: a ```%s block that holds Go: fence it as ```go so that it is compiled", b.where(), b.lang)
		}
	}
}

// looksLikeGo reports whether a block starts as only Go does.
func looksLikeGo(src string) bool {
	for _, p := range []string{"package ", "import (", "func (", "func main("} {
		if strings.HasPrefix(src, p) {
			return true
		}
	}
	return false
}

// maxNoCompile bounds the Go blocks exempted from compiling: the exemption
// is for the rare block that cannot compile by design.
const maxNoCompile = 2

// TestDocsGoBlocksCompile type-checks and vets every ```go block of
// README.md and docs/*.md but those marked go:nocompile, in one go vet over
// one package per block: a whole file (package clause first) as it is, a
// fragment wrapped as docs/layout.md describes. Errors name the Markdown
// file and line. Whole files, and fragments go/format can read, must also
// be gofmt'ed.
func TestDocsGoBlocksCompile(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go vet")
	}
	blocks, _ := docBlocks(t)
	var goBlocks []docBlock
	exempt := 0
	for _, b := range blocks {
		if b.lang != "go" {
			continue
		}
		if b.directive == "nocompile" {
			t.Logf("%s: not compiled: %s", b.where(), b.directiveArg)
			exempt++
			continue
		}
		goBlocks = append(goBlocks, b)
		src := b.src
		if formatted, err := format.Source([]byte(src)); err == nil && string(formatted) != src {
			t.Errorf("%s: the Go block is not gofmt'ed", b.where())
		} else if err != nil && strings.HasPrefix(src, "package ") {
			t.Errorf("%s: the Go block does not parse: %v", b.where(), err)
		}
	}
	if exempt > maxNoCompile {
		t.Errorf("%d Go blocks are marked go:nocompile, want at most %d: make them compile", exempt, maxNoCompile)
	}
	if len(goBlocks) < 15 {
		t.Errorf("found %d Go blocks in the documentation, want at least 15 (is the fence parser broken?)", len(goBlocks))
	}
	start := time.Now()
	if out, err := compileBlocks(t, repoRoot(t), goBlocks); err != nil {
		t.Errorf("the documentation's Go blocks do not compile: %v\n%s", err, out)
	}
	t.Logf("vetted %d Go blocks in %v", len(goBlocks), time.Since(start).Round(time.Millisecond))
}

// checkSample is a page for TestDocsCheckFindsErrors: two fragments that
// compile only as the check wraps them, and three with an error each.
const checkSample = `# A sample

<!-- go:context locker *reqlock.Locker; ctx context.Context; return error -->
~~~go
lock, err := locker.Obtain(ctx, "k", time.Second, 0)
if err := lock.Release(ctx); errors.Is(err, reqlock.ErrNotHeld) {
	for i, k := range lock.Keys() {
		log.Print(k)
	}
}
~~~

- In a list:

  <!-- go:context r *gin.Engine -->
  ~~~go
  func handler(c *gin.Context) {
  	id := c.Param("id")
  }

  r.GET("/", handler)
  ~~~

~~~go
r.GET("/", handler) // r: undefined
~~~

~~~go
var l *reqlock.Locker
l.Obtian(nil, "k", 0, 0) // misspelt
~~~

<!-- go:context locker *reqlock.Lockr -->
~~~go
_ = locker
~~~
`

// TestDocsCheckFindsErrors checks the check: fragments that compile with
// their context, unused names and the imports the wrapper adds pass; a
// fragment with an error fails, naming its file and line.
func TestDocsCheckFindsErrors(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go vet")
	}
	blocks, problems := codeBlocks("docs/sample.md", checkSample)
	if len(problems) > 0 || len(blocks) != 5 {
		t.Fatalf("codeBlocks: %d blocks, problems %q; want 5 blocks and no problem", len(blocks), problems)
	}
	if out, err := compileBlocks(t, repoRoot(t), blocks[:2]); err != nil {
		t.Errorf("the sample's good fragments: %v\n%s", err, out)
	}
	out, err := compileBlocks(t, repoRoot(t), blocks[2:])
	if err == nil {
		t.Fatal("the sample's broken fragments compiled")
	}
	lines := strings.Split(checkSample, "\n")
	for _, want := range []struct{ line, msg string }{
		{`r.GET("/", handler) // r: undefined`, "undefined: r"},
		{`l.Obtian(nil, "k", 0, 0) // misspelt`, "l.Obtian undefined"},
		{`<!-- go:context locker *reqlock.Lockr -->`, "undefined: reqlock.Lockr"}, // the directive's line
	} {
		at := fmt.Sprintf("docs/sample.md:%d:", slices.Index(lines, want.line)+1)
		if !regexp.MustCompile(regexp.QuoteMeta(at) + `\d+: ` + regexp.QuoteMeta(want.msg)).MatchString(out) {
			t.Errorf("the output does not say %s<column>: %s:\n%s", at, want.msg, out)
		}
	}
}

// compileBlocks writes each Go block (goSource) as a package of a module
// that requires what this one does, and runs go vet on them all, which
// type-checks each and reports its first error. It returns vet's output,
// with paths relative to the repository's root and each package named by
// its block.
func compileBlocks(t *testing.T, root string, blocks []docBlock) (string, error) {
	t.Helper()
	dir := t.TempDir()
	mod, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	sum, err := os.ReadFile("go.sum")
	if err != nil {
		t.Fatal(err)
	}
	here, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	// The same requirements, the replaced modules found from anywhere.
	modText := regexp.MustCompile(`(?m)^module .*$`).ReplaceAllString(string(mod), "module docblocks")
	modText = regexp.MustCompile(`=> (\.\.?/\S*)`).ReplaceAllStringFunc(modText, func(s string) string {
		return "=> " + filepath.Join(here, strings.TrimPrefix(s, "=> "))
	})
	write := func(name, text string) {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", modText)
	write("go.sum", string(sum))
	var pkgs []string
	headers := map[string]string{} // "# docblocks/bNN" to the block it holds
	for i, b := range blocks {
		pkg := fmt.Sprintf("b%02d", i+1)
		src, err := goSource(b, filepath.Join(root, b.file))
		if err != nil {
			return "", fmt.Errorf("%s: %v", b.where(), err)
		}
		write(filepath.Join(pkg, "block.go"), src)
		pkgs = append(pkgs, "./"+pkg)
		headers["# docblocks/"+pkg+"\n"] = "# " + b.where() + " (```go block)\n"
	}
	cmd := exec.Command("go", append([]string{"vet"}, pkgs...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off")
	out, err := cmd.CombinedOutput()
	// go vet names a main package twice, the second time in brackets.
	text := regexp.MustCompile(`(?m)^# \[docblocks/b\d+\]\n`).ReplaceAllString(string(out), "")
	for h, w := range headers {
		text = strings.ReplaceAll(text, h, w)
	}
	if rel, err := filepath.Rel(dir, root); err == nil {
		text = strings.ReplaceAll(text, rel+string(filepath.Separator), "")
	}
	return strings.ReplaceAll(text, root+string(filepath.Separator), ""), err
}

var (
	mdLink  = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	heading = regexp.MustCompile(`(?m)^#{1,6} (.*)$`)
)

// anchors returns the GitHub anchors of a Markdown text's headings.
func anchors(text string) map[string]bool {
	a := make(map[string]bool)
	for _, m := range heading.FindAllStringSubmatch(withoutCode(text), -1) {
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
		for _, m := range mdLink.FindAllStringSubmatch(withoutCode(text), -1) {
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
