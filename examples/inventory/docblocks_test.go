package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/scanner"
	"go/token"
	"regexp"
	"slices"
	"strings"
)

// The documentation's code blocks, and how a Go block that is not a whole
// file is made into one (TestDocsGoBlocksCompile compiles them). The rules
// are written for contributors in docs/layout.md ("Documentation checks").

// docBlock is one fenced code block of a Markdown file.
type docBlock struct {
	file      string // the Markdown file, relative to the repository root
	fenceLine int    // the line of the opening fence, from 1
	lang      string // the first word of the fence's info string; "" if none
	src       string // the content, without the fence's indentation
	indent    int    // the columns of indentation removed from each line
	// directive is the go: comment on the line right before the fence:
	// its kind ("context" or "nocompile"; "" if none) and the rest.
	directive, directiveArg string
}

// where names the block for messages: its file and the line of its fence.
func (b docBlock) where() string { return fmt.Sprintf("%s:%d", b.file, b.fenceLine) }

var (
	fenceOpen = regexp.MustCompile("^( *)(```+|~~~+)(.*)$")
	directive = regexp.MustCompile(`^\s*<!--\s*go:(\w*)\s*(.*?)\s*-->\s*$`)
)

// codeBlocks returns the fenced code blocks of a Markdown text, in order,
// and the problems of its go: directives: one not right before a ```go
// fence, of an unknown kind, or a nocompile without its reason.
func codeBlocks(file, text string) (blocks []docBlock, problems []string) {
	lines := strings.Split(text, "\n")
	used := map[int]bool{} // lines of directives that precede a Go block
	for i := 0; i < len(lines); i++ {
		m := fenceOpen.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		b := docBlock{file: file, fenceLine: i + 1, indent: len(m[1])}
		if f := strings.Fields(m[3]); len(f) > 0 {
			b.lang = f[0]
		}
		var body []string
		j := i + 1
		for ; j < len(lines); j++ {
			l := strings.TrimLeft(lines[j], " ")
			if strings.HasPrefix(l, m[2]) && strings.Trim(l, m[2][:1]+" \t") == "" {
				break
			}
			body = append(body, strings.TrimPrefix(lines[j], m[1]))
		}
		if len(body) > 0 {
			b.src = strings.Join(body, "\n") + "\n"
		}
		if i > 0 && b.lang == "go" {
			if d := directive.FindStringSubmatch(lines[i-1]); d != nil {
				b.directive, b.directiveArg = d[1], d[2]
				used[i-1] = true
				switch {
				case b.directive != "context" && b.directive != "nocompile":
					problems = append(problems, fmt.Sprintf("%s:%d: unknown directive go:%s (want go:context or go:nocompile)", file, i, b.directive))
				case b.directive == "nocompile" && b.directiveArg == "":
					problems = append(problems, fmt.Sprintf("%s:%d: go:nocompile without its reason: <!-- go:nocompile why it cannot compile -->", file, i))
				}
			}
		}
		blocks = append(blocks, b)
		i = j
	}
	for i, l := range lines {
		if directive.MatchString(l) && !used[i] {
			problems = append(problems, fmt.Sprintf("%s:%d: a go: directive must be the line right before a ```go fence", file, i+1))
		}
	}
	return blocks, problems
}

// withoutCode returns text with its fenced code blocks blanked out, for the
// link and heading checks.
func withoutCode(text string) string {
	lines := strings.Split(text, "\n")
	blocks, _ := codeBlocks("", text)
	for _, b := range blocks {
		end := b.fenceLine + strings.Count(b.src, "\n") + 1 // the closing fence's line
		for i := b.fenceLine - 1; i < end && i < len(lines); i++ {
			lines[i] = ""
		}
	}
	return strings.Join(lines, "\n")
}

// docImports are the packages a Go block of the docs may use without
// importing them: the wrapper imports those whose name the block uses as
// name.X. Each must resolve in this module.
var docImports = map[string]string{
	"reqlock":      "github.com/reqlock/reqlock",
	"middleware":   "github.com/reqlock/reqlock/middleware",
	"keyfunc":      "github.com/reqlock/reqlock/keyfunc",
	"routetable":   "github.com/reqlock/reqlock/routetable",
	"ginlock":      "github.com/reqlock/reqlock/ginlock",
	"echolock":     "github.com/reqlock/reqlock/echolock",
	"metrics":      "github.com/reqlock/reqlock/metrics",
	"stores":       "github.com/reqlock/reqlock/stores",
	"memstore":     "github.com/reqlock/reqlock/stores/memstore",
	"redisstore":   "github.com/reqlock/reqlock/stores/redisstore",
	"rueidisstore": "github.com/reqlock/reqlock/stores/redisstore/rueidisstore",
	"rueidis":      "github.com/redis/rueidis",
	"redlockstore": "github.com/reqlock/reqlock/stores/redlockstore",
	"filestore":    "github.com/reqlock/reqlock/stores/filestore",
	"etcdstore":    "github.com/reqlock/reqlock/stores/etcdstore",
	"zkstore":      "github.com/reqlock/reqlock/stores/zkstore",
	"mysqlstore":   "github.com/reqlock/reqlock/stores/mysqlstore",
	"pgstore":      "github.com/reqlock/reqlock/stores/pgstore",
	"gin":          "github.com/gin-gonic/gin",
	"echo":         "github.com/labstack/echo/v4",
	"redis":        "github.com/redis/go-redis/v9",
	"clientv3":     "go.etcd.io/etcd/client/v3",
	"pgxpool":      "github.com/jackc/pgx/v5/pgxpool",
	"sql":          "database/sql",
	"http":         "net/http",
	"json":         "encoding/json",
	"context":      "context",
	"errors":       "errors",
	"fmt":          "fmt",
	"log":          "log",
	"slog":         "log/slog",
	"os":           "os",
	"time":         "time",
}

// docContext is what a go:context directive declares for its block.
type docContext struct {
	vars    [][2]string // name and type of each variable
	results []string    // the result types of the function holding the statements
}

var contextEntry = regexp.MustCompile(`^(\w+(?:\s*,\s*\w+)*)\s+(\S.*)$`)

// parseContext parses the text after "go:context": entries separated by
// ";", each "name Type" (or "name1, name2 Type"), or "return Type, ..."
// for the results of the function that holds the block's statements.
func parseContext(s string) (docContext, error) {
	var c docContext
	for e := range strings.SplitSeq(s, ";") {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		m := contextEntry.FindStringSubmatch(e)
		if m == nil {
			return c, fmt.Errorf("go:context entry %q: want \"name Type\" or \"return Type\"", e)
		}
		if m[1] == "return" {
			for r := range strings.SplitSeq(m[2], ",") {
				c.results = append(c.results, strings.TrimSpace(r))
			}
			continue
		}
		for name := range strings.SplitSeq(m[1], ",") {
			c.vars = append(c.vars, [2]string{strings.TrimSpace(name), m[2]})
		}
	}
	return c, nil
}

// unit is a run of a Go fragment's top-level text: declarations (func,
// type, var, const, import) or statements.
type unit struct {
	decl       bool
	start, end int // byte offsets in the fragment
	imports    bool
}

// splitUnits splits a Go fragment into runs of top-level declarations and
// of statements, in order. A declaration starts with func NAME (or a method
// receiver), type, var, const or import at nesting depth 0, and ends at the
// next semicolon (written or automatic) at depth 0.
func splitUnits(src string) []unit {
	type tok struct {
		pos, end int
		tok      token.Token
	}
	fset := token.NewFileSet()
	f := fset.AddFile("", -1, len(src))
	var s scanner.Scanner
	s.Init(f, []byte(src), nil, 0)
	var toks []tok
	for {
		pos, t, lit := s.Scan()
		if t == token.EOF {
			break
		}
		off := f.Offset(pos)
		n := len(lit)
		if lit == "" {
			n = len(t.String())
		}
		if t == token.SEMICOLON && lit == "\n" {
			n = 0
		}
		toks = append(toks, tok{off, off + n, t})
	}
	// isDecl reports whether the statement starting at toks[i] is a
	// declaration.
	isDecl := func(i int) bool {
		switch toks[i].tok {
		case token.TYPE, token.VAR, token.CONST, token.IMPORT:
			return true
		case token.FUNC:
			if i+1 < len(toks) && toks[i+1].tok == token.IDENT {
				return true
			}
			// func (recv) Name: a method; func (...) {...}(): a literal.
			depth := 0
			for j := i + 1; j < len(toks); j++ {
				switch toks[j].tok {
				case token.LPAREN:
					depth++
				case token.RPAREN:
					depth--
					if depth == 0 {
						return j+1 < len(toks) && toks[j+1].tok == token.IDENT
					}
				}
			}
		}
		return false
	}
	var units []unit
	depth, start := 0, -1
	for i, t := range toks {
		if start < 0 {
			if t.tok == token.SEMICOLON {
				continue
			}
			start = i
		}
		switch t.tok {
		case token.LPAREN, token.LBRACE, token.LBRACK:
			depth++
		case token.RPAREN, token.RBRACE, token.RBRACK:
			depth--
		}
		last := i == len(toks)-1
		if depth == 0 && (t.tok == token.SEMICOLON || last) {
			endTok := i
			if t.tok == token.SEMICOLON && t.end == t.pos {
				endTok = i - 1 // an automatic semicolon: end at the token before it
			}
			u := unit{decl: isDecl(start), start: toks[start].pos, end: toks[endTok].end,
				imports: toks[start].tok == token.IMPORT}
			if n := len(units); n > 0 && units[n-1].decl == u.decl && units[n-1].imports == u.imports {
				units[n-1].end = u.end
			} else {
				units = append(units, u)
			}
			start = -1
		}
	}
	return units
}

// selectorNames returns the identifiers src uses as the left side of a
// selector (name.X) that are not themselves selected (a.name.X).
func selectorNames(src string) map[string]bool {
	fset := token.NewFileSet()
	f := fset.AddFile("", -1, len(src))
	var s scanner.Scanner
	s.Init(f, []byte(src), nil, 0)
	names := map[string]bool{}
	prev, prevLit := token.ILLEGAL, ""
	for {
		_, t, lit := s.Scan()
		if t == token.EOF {
			break
		}
		if t == token.PERIOD && prev == token.IDENT {
			names[prevLit] = true
		}
		if prev == token.PERIOD && t == token.IDENT {
			t = token.ILLEGAL // a.name: not a package name
		}
		prev, prevLit = t, lit
	}
	return names
}

// lineCol returns the line and column, from 1, of offset off in src.
func lineCol(src string, off int) (int, int) {
	line := 1 + strings.Count(src[:off], "\n")
	return line, off - strings.LastIndex(src[:off], "\n")
}

// goSource returns the Go file that compiles the Go block b: b itself,
// with a //line comment, when it is a whole file (it starts with its
// package clause), else wrapFragment's. file is the Markdown file's path for
// the //line comments, normally absolute.
func goSource(b docBlock, file string) (string, error) {
	if !strings.HasPrefix(b.src, "package ") {
		return wrapFragment(b, file)
	}
	if b.directive != "" {
		return "", fmt.Errorf("a whole Go file takes no go:%s directive", b.directive)
	}
	return fmt.Sprintf("//line %s:%d:1\n%s", file, b.fenceLine+1, b.src), nil
}

// wrapFragment returns a Go file, of package doc, that compiles the Go
// fragment of b: its declarations at package level, its statements in the
// body of a function, the variables of its go:context directive at package
// level, imports added for the docImports it uses, and every name it
// declares in a function used (so that a fragment need not use what it
// shows). //line comments map each line back to the block's file and line
// (file is the path written in them, normally absolute).
func wrapFragment(b docBlock, file string) (string, error) {
	var ctx docContext
	if b.directive == "context" {
		var err error
		if ctx, err = parseContext(b.directiveArg); err != nil {
			return "", err
		}
	}
	// at returns the //line comment for offset off of the block.
	at := func(off int) string {
		l, c := lineCol(b.src, off)
		return fmt.Sprintf("\n//line %s:%d:%d\n", file, b.fenceLine+l, c+b.indent)
	}
	back := fmt.Sprintf("\n//line %s:%d:1\n", file, b.fenceLine) // wrapper lines: the fence's

	units := splitUnits(b.src)
	var imports, decls, stmts strings.Builder
	for _, u := range units {
		text := at(u.start) + b.src[u.start:u.end] + back
		switch {
		case u.imports:
			imports.WriteString(text)
		case u.decl:
			decls.WriteString(text)
		default:
			stmts.WriteString(text)
		}
	}
	// The names a package may not take: what the context declares, and the
	// block's own imports.
	var ctxTypes []string
	taken := map[string]bool{}
	if imports.Len() > 0 {
		f, err := parser.ParseFile(token.NewFileSet(), "", "package p\n"+imports.String(), parser.ImportsOnly)
		if err != nil {
			return "", fmt.Errorf("its imports: %v", err)
		}
		for _, imp := range f.Imports {
			taken[importName(imp)] = true
		}
	}
	for _, v := range ctx.vars {
		taken[v[0]] = true
		ctxTypes = append(ctxTypes, v[1])
	}
	used := selectorNames(b.src + "\n" + strings.Join(append(ctxTypes, ctx.results...), "\n"))

	var g strings.Builder
	g.WriteString("package doc\n")
	g.WriteString(imports.String())
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range used {
			if !yield(n) {
				return
			}
		}
	})
	for _, n := range names {
		if p, ok := docImports[n]; ok && !taken[n] {
			fmt.Fprintf(&g, "import %s %q\n", n, p)
		}
	}
	if len(ctx.vars) > 0 {
		fmt.Fprintf(&g, "\n//line %s:%d:1\n", file, b.fenceLine-1) // the directive's line
		g.WriteString("var (")
		for i, v := range ctx.vars {
			if i > 0 {
				g.WriteString("; ")
			}
			fmt.Fprintf(&g, "%s %s", v[0], v[1])
		}
		g.WriteString(")\n")
	}
	g.WriteString(decls.String())
	if stmts.Len() > 0 {
		var results []string
		for _, r := range ctx.results {
			results = append(results, "_ "+r)
		}
		fmt.Fprintf(&g, "func _() (%s) {%s\n}\n", strings.Join(results, ", "), stmts.String())
	}
	return useDeclared(g.String(), len(ctx.results) > 0), nil
}

// useDeclared returns src with every name declared inside a function used
// (`_ = x` after its declaration), every import the file does not use made
// blank, and, when the function of the statements has results and does not
// end with a return, a bare return. src is returned unchanged if it does not
// parse: the compiler then reports the syntax error.
func useDeclared(src string, results bool) string {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "", src, parser.SkipObjectResolution)
	if err != nil {
		return src
	}
	off := func(p token.Pos) int { return fset.PositionFor(p, false).Offset }
	type edit struct {
		at   int
		text string
	}
	var edits []edit
	use := func(at int, names []string, after bool) {
		var n []string
		for _, name := range names {
			if name != "_" {
				n = append(n, name)
			}
		}
		if len(n) == 0 {
			return
		}
		blanks := strings.TrimSuffix(strings.Repeat("_, ", len(n)), ", ")
		s := blanks + " = " + strings.Join(n, ", ")
		if after {
			edits = append(edits, edit{at, "; " + s})
		} else {
			edits = append(edits, edit{at, s + "; "})
		}
	}
	idents := func(exprs []ast.Expr) []string {
		var n []string
		for _, e := range exprs {
			if id, ok := e.(*ast.Ident); ok {
				n = append(n, id.Name)
			}
		}
		return n
	}
	// declared returns the names a statement declares in its own scope.
	declared := func(s ast.Stmt) []string {
		switch s := s.(type) {
		case *ast.AssignStmt:
			if s.Tok == token.DEFINE {
				return idents(s.Lhs)
			}
		case *ast.DeclStmt:
			if g, ok := s.Decl.(*ast.GenDecl); ok && g.Tok != token.TYPE {
				var n []string
				for _, sp := range g.Specs {
					for _, id := range sp.(*ast.ValueSpec).Names {
						n = append(n, id.Name)
					}
				}
				return n
			}
		}
		return nil
	}
	list := func(stmts []ast.Stmt) {
		for _, s := range stmts {
			use(off(s.End()), declared(s), true)
		}
	}
	// atStart uses names at the start of each body.
	atStart := func(names []string, bodies ...token.Pos) {
		for _, p := range bodies {
			use(off(p)+1, names, false)
		}
	}
	clauses := func(body *ast.BlockStmt) []token.Pos {
		var colons []token.Pos
		for _, c := range body.List {
			switch c := c.(type) {
			case *ast.CaseClause:
				colons = append(colons, c.Colon)
			case *ast.CommClause:
				colons = append(colons, c.Colon)
			}
		}
		return colons
	}
	pkgUses := map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.SelectorExpr:
			if id, ok := n.X.(*ast.Ident); ok {
				pkgUses[id.Name] = true
			}
		case *ast.BlockStmt:
			list(n.List)
		case *ast.CaseClause:
			list(n.Body)
		case *ast.CommClause:
			list(n.Body)
			if n.Comm != nil {
				atStart(declared(n.Comm), n.Colon)
			}
		case *ast.IfStmt:
			if n.Init != nil {
				atStart(declared(n.Init), n.Body.Lbrace)
			}
		case *ast.ForStmt:
			if n.Init != nil {
				atStart(declared(n.Init), n.Body.Lbrace)
			}
		case *ast.RangeStmt:
			if n.Tok == token.DEFINE {
				atStart(idents([]ast.Expr{n.Key, n.Value}), n.Body.Lbrace)
			}
		case *ast.SwitchStmt:
			if n.Init != nil {
				atStart(declared(n.Init), clauses(n.Body)...)
			}
		case *ast.TypeSwitchStmt:
			names := declared(n.Assign)
			if n.Init != nil {
				names = append(names, declared(n.Init)...)
			}
			atStart(names, clauses(n.Body)...)
		}
		return true
	})
	for _, imp := range f.Imports {
		if imp.Name != nil {
			continue // the wrapper's own imports, or a block's named one
		}
		if !pkgUses[importName(imp)] {
			edits = append(edits, edit{off(imp.Path.Pos()), "_ "})
		}
	}
	if results {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Name.Name != "_" || fd.Recv != nil {
				continue
			}
			body := fd.Body.List
			if len(body) == 0 {
				edits = append(edits, edit{off(fd.Body.Rbrace), "return\n"})
			} else if _, ok := body[len(body)-1].(*ast.ReturnStmt); !ok {
				edits = append(edits, edit{off(fd.Body.Rbrace), "return\n"})
			}
		}
	}
	slices.SortStableFunc(edits, func(a, b edit) int { return b.at - a.at })
	for _, e := range edits {
		src = src[:e.at] + e.text + src[e.at:]
	}
	return src
}

// importName returns the name an import declares: its own, the name
// docImports gives its path, or else the path's last element.
func importName(imp *ast.ImportSpec) string {
	if imp.Name != nil {
		return imp.Name.Name
	}
	path := strings.Trim(imp.Path.Value, `"`)
	for n, p := range docImports {
		if p == path {
			return n
		}
	}
	return path[strings.LastIndex(path, "/")+1:]
}
