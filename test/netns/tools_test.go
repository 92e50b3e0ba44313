package netns

import (
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// checkedTools are the tools that are not part of every Debian system
// and that the tests run, directly or in the VM (which runs the host's
// binaries): each must be required on every path that runs it.
var checkedTools = []string{"ping", "arping", "nstat", "iperf3", "iperf", "tshark", "tcpdump", "ethtool",
	"ovs-vsctl", "ovsdb-tool", "ovsdb-server", "ovs-vswitchd", "ovs-appctl", "ovsdb-client",
	"dnsmasq", "dhclient", "qemu-system-x86_64", "rdma", "ibv_devinfo", "curl", "ndisc6", "prometheus", "promtool",
	"dpkg-deb", "lintian", "debootstrap", "systemd-analyze", "podman", "runc"}

// requireFuncs are the functions whose arguments are tools required.
var requireFuncs = []string{"require", "nstestRequire", "Require"}

// vmScriptMethods are the methods that run a shell script in the VM:
// the words of their string arguments are commands.
var vmScriptMethods = []string{"run", "must", "start", "sh"}

// fnInfo is what TestToolsRequired gathers of one function declaration
// (closures in it included).
type fnInfo struct {
	uses     map[string]token.Pos // tools it names as commands
	requires map[string]bool      // tools it requires itself
	calls    map[string]bool      // functions and methods it calls, by name
	hasT     bool                 // it takes a *testing.T or testing.TB
}

// TestToolsRequired keeps the per-test tool requirements honest without
// root. It parses this package. A function may name a tool of
// checkedTools as a command: a string argument equal to the tool, or a
// word of a script run in the VM. The test fails unless the function, or
// a function it calls (transitively), requires the tool. A function
// without a t of its own is covered when each of its callers is. It
// cannot see a command built from a variable, and a requirement counts
// wherever it sits in the function. So it catches the tool forgotten,
// not the tool required too late.
func TestToolsRequired(t *testing.T) {
	fset := token.NewFileSet()
	files, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	vars := map[string]ast.Expr{} // package-level variables, for lists of tools
	var decls []*ast.FuncDecl
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				decls = append(decls, d)
			case *ast.GenDecl:
				for _, s := range d.Specs {
					if vs, ok := s.(*ast.ValueSpec); ok && len(vs.Values) == len(vs.Names) {
						for i, n := range vs.Names {
							vars[n.Name] = vs.Values[i]
						}
					}
				}
			}
		}
	}
	fns := map[string][]*fnInfo{} // by name: methods of different types may share one
	for _, d := range decls {
		if d.Name.Name == "TestToolsRequired" {
			continue // its lists name every tool
		}
		info := gather(d, vars)
		fns[d.Name.Name] = append(fns[d.Name.Name], info)
	}
	// requiresAll: the tools a function requires itself or through the
	// functions it calls.
	memo := map[*fnInfo]map[string]bool{}
	var requiresAll func(f *fnInfo) map[string]bool
	requiresAll = func(f *fnInfo) map[string]bool {
		if r, ok := memo[f]; ok {
			return r
		}
		r := map[string]bool{}
		memo[f] = r // a recursive call adds nothing more
		for tool := range f.requires {
			r[tool] = true
		}
		for callee := range f.calls {
			for _, g := range fns[callee] {
				for tool := range requiresAll(g) {
					r[tool] = true
				}
			}
		}
		return r
	}
	callers := map[*fnInfo][]*fnInfo{}
	for _, infos := range fns {
		for _, f := range infos {
			for callee := range f.calls {
				for _, g := range fns[callee] {
					callers[g] = append(callers[g], f)
				}
			}
		}
	}
	var covered func(f *fnInfo, tool string, seen map[*fnInfo]bool) bool
	covered = func(f *fnInfo, tool string, seen map[*fnInfo]bool) bool {
		if requiresAll(f)[tool] {
			return true
		}
		if f.hasT || seen[f] || len(callers[f]) == 0 {
			return false
		}
		seen[f] = true
		for _, c := range callers[f] {
			if !covered(c, tool, seen) {
				return false
			}
		}
		return true
	}
	uses := 0
	for name, infos := range fns {
		for _, f := range infos {
			for tool, pos := range f.uses {
				uses++
				if !covered(f, tool, map[*fnInfo]bool{}) {
					t.Errorf("%s: %s runs %s, but neither it nor what it calls requires it (nstestRequire, require)", fset.Position(pos), name, tool)
				}
			}
		}
	}
	if uses == 0 {
		t.Fatal("found no tool used: the check looks at nothing")
	}
}

// gather collects what function d names, requires and calls.
func gather(d *ast.FuncDecl, vars map[string]ast.Expr) *fnInfo {
	f := &fnInfo{uses: map[string]token.Pos{}, requires: map[string]bool{}, calls: map[string]bool{}}
	for _, p := range d.Type.Params.List {
		if s := types.ExprString(p.Type); s == "*testing.T" || s == "testing.TB" {
			f.hasT = true
		}
	}
	use := func(tool string, pos token.Pos) {
		if slices.Contains(checkedTools, tool) {
			if _, ok := f.uses[tool]; !ok {
				f.uses[tool] = pos
			}
		}
	}
	subtestName := map[ast.Node]bool{}
	ast.Inspect(d.Body, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING && !subtestName[lit] {
				s, _ := strconv.Unquote(lit.Value)
				use(s, lit.Pos())
			}
			return true
		}
		var name string
		var method bool
		switch fun := call.Fun.(type) {
		case *ast.Ident:
			name = fun.Name
		case *ast.SelectorExpr:
			name, method = fun.Sel.Name, true
		}
		f.calls[name] = true
		switch {
		case slices.Contains(requireFuncs, name):
			for _, a := range call.Args {
				for _, tool := range toolList(a, vars) {
					f.requires[tool] = true
				}
			}
			return false
		case method && name == "Run" && len(call.Args) > 0:
			subtestName[call.Args[0]] = true // no command
		case method && slices.Contains(vmScriptMethods, name):
			for _, a := range call.Args {
				ast.Inspect(a, func(n ast.Node) bool {
					if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
						s, _ := strconv.Unquote(lit.Value)
						for _, w := range strings.FieldsFunc(s, func(r rune) bool { return strings.ContainsRune(" \t\n;&|()$'\"`=", r) }) {
							use(w, lit.Pos())
						}
					}
					return true
				})
			}
		}
		return true
	})
	return f
}

// toolList evaluates an argument of a require call: a string, a
// package-level list of strings, or append of those.
func toolList(e ast.Expr, vars map[string]ast.Expr) []string {
	switch e := e.(type) {
	case *ast.BasicLit:
		s, _ := strconv.Unquote(e.Value)
		return []string{s}
	case *ast.Ident:
		if v, ok := vars[e.Name]; ok {
			return toolList(v, vars)
		}
	case *ast.CompositeLit:
		var l []string
		for _, el := range e.Elts {
			l = append(l, toolList(el, vars)...)
		}
		return l
	case *ast.CallExpr:
		if id, ok := e.Fun.(*ast.Ident); ok && id.Name == "append" {
			var l []string
			for _, a := range e.Args {
				l = append(l, toolList(a, vars)...)
			}
			return l
		}
	}
	return nil
}
