package shim

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// endCounters are the functions that count an outcome (a counter marked
// stat.TxEnd or stat.RxEnd) themselves rather than as a verdict: end,
// the TAP write of the received frames, and the holders of frames for
// later, where those frames end.
var endCounters = []string{
	"counters.go end",
	"rx.go writeQueues",
	"newvif.go drop", "newvif.go dropAll", // held frames of new guests
	"resolve.go tick", "resolve.go flush", "resolve.go dropAll", // frames queued for a resolution
	"groups.go ready", "groups.go dropLocked", // frames held for a group join
}

// TestOutcomesCountedOnlyByVerdicts reads the package's source: every
// verdict(X) names an outcome (a counter marked stat.TxEnd or
// stat.RxEnd), and no function but those in endCounters counts an
// outcome itself. It does not run the pipelines: that each frame ends
// in exactly one outcome is TestConservation's and
// TestConservationSplitAndHeld's to show.
func TestOutcomesCountedOnlyByVerdicts(t *testing.T) {
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]Counter{}
	var parsed []*ast.File
	var names []string
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		parsed = append(parsed, f)
		names = append(names, name)
		if name == "counters.go" {
			byName = counterNames(f)
		}
	}
	if len(byName) != int(numCounters) {
		t.Fatalf("read %d counter names in counters.go, want %d", len(byName), numCounters)
	}
	isEnd := func(e ast.Expr) (string, bool) {
		id, ok := e.(*ast.Ident)
		if !ok {
			return "", false
		}
		c, ok := byName[id.Name]
		return id.Name, ok && counterTable[c].End != 0
	}
	verdicts := 0
	for i, f := range parsed {
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			allowed := slices.Contains(endCounters, names[i]+" "+fn.Name.Name)
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.CallExpr:
					if id, ok := n.Fun.(*ast.Ident); ok && id.Name == "verdict" && len(n.Args) == 1 {
						if a, ok := n.Args[0].(*ast.Ident); ok {
							if _, known := byName[a.Name]; !known {
								break
							}
							if _, end := isEnd(a); !end {
								t.Errorf("%s: %s returns verdict(%s), not an outcome", fset.Position(n.Pos()), fn.Name.Name, a.Name)
							}
							verdicts++
						}
					}
					if sel, ok := n.Fun.(*ast.SelectorExpr); ok && (sel.Sel.Name == "inc" || sel.Sel.Name == "add") && len(n.Args) > 0 {
						if name, end := isEnd(n.Args[0]); end && !allowed {
							t.Errorf("%s: %s counts the outcome %s itself: return verdict(%s)", fset.Position(n.Pos()), fn.Name.Name, name, name)
						}
					}
				case *ast.IndexExpr:
					if name, end := isEnd(n.Index); end && !allowed {
						t.Errorf("%s: %s counts the outcome %s itself: return verdict(%s)", fset.Position(n.Pos()), fn.Name.Name, name, name)
					}
				}
				return true
			})
		}
	}
	if verdicts < 30 {
		t.Fatalf("found %d verdicts naming a counter: the source was not read as expected", verdicts)
	}
}

// counterNames maps the names of the Counter constants of counters.go to
// their values (the const block that starts at TxFrames with iota).
func counterNames(f *ast.File) map[string]Counter {
	m := map[string]Counter{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST || len(g.Specs) == 0 {
			continue
		}
		if v := g.Specs[0].(*ast.ValueSpec); v.Names[0].Name != "TxFrames" {
			continue
		}
		for i, s := range g.Specs {
			name := s.(*ast.ValueSpec).Names[0].Name
			if name != "numCounters" {
				m[name] = Counter(i)
			}
		}
	}
	return m
}
