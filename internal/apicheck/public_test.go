package apicheck

import (
	"fmt"
	"go/types"
	"os"
	"slices"
	"strings"
	"testing"

	"golang.org/x/tools/go/packages"
)

// module is the import path every package of eipoibd starts with.
const module = "github.com/eipoib/eipoibd"

// What each package outside internal/ is, besides the commands (package
// main): docs/architecture.md, "What is public", says why.
var (
	// public are eipoibd's Go API: the byte views and tables of the
	// protocol, and the fabric Port interface.
	public = []string{"arpndp", "ether", "ipoib", "mactrans", "snoop"}
	// notAPI stay where they are but promise no Go API: the Kubernetes
	// files' directory (its Go code renders them for its tests) and the
	// end-to-end tests.
	notAPI = []string{"deploy/kubernetes", "test/netns"}
)

// internal says whether an importer outside the module is refused
// path: it has an element "internal" (the go command's rule).
func internal(path string) bool {
	return slices.Contains(strings.Split(path, "/"), "internal")
}

// load type-checks every package of the module built with tags (the
// packages it imports come from export data).
func load(t *testing.T, tags string) []*packages.Package {
	t.Helper()
	cfg := &packages.Config{Mode: packages.NeedName | packages.NeedTypes, Dir: "../.."}
	if tags != "" {
		cfg.BuildFlags = []string{"-tags", tags}
	}
	pkgs, err := packages.Load(cfg, module+"/...")
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgs) < 10 {
		t.Fatalf("loaded %d packages of %s, want the module's", len(pkgs), module)
	}
	for _, p := range pkgs {
		for _, e := range p.Errors {
			t.Errorf("-tags %q: %s: %v", tags, p.PkgPath, e)
		}
	}
	return pkgs
}

// TestPublicAPIUsesNoInternalType fails for each exported identifier of
// a package outside internal/, built without and with the verbs tag (a
// constant, variable, function, type, a struct's exported field or an
// exported method, the promoted ones included), whose type mentions a
// type declared in an internal package: a program outside the module
// could call it but not name what it takes or returns.
func TestPublicAPIUsesNoInternalType(t *testing.T) {
	for _, tags := range []string{"", "verbs"} {
		for _, p := range load(t, tags) {
			if internal(p.PkgPath) || p.Name == "main" {
				continue
			}
			for _, leak := range leaks(p.Types) {
				t.Errorf("-tags %q: %s", tags, leak)
			}
		}
	}
}

// TestEveryPackageOutsideInternalIsDecided fails for a package outside
// internal/ that is no command and is neither public nor notAPI (put
// it under internal/, or say in docs/architecture.md why it is public
// and add it here), and for a listed package that is gone.
func TestEveryPackageOutsideInternalIsDecided(t *testing.T) {
	decided := slices.Concat(public, notAPI)
	var found []string
	for _, p := range load(t, "") {
		rel := strings.TrimPrefix(strings.TrimPrefix(p.PkgPath, module), "/")
		if internal(p.PkgPath) || p.Name == "main" {
			continue
		}
		found = append(found, rel)
		if !slices.Contains(decided, rel) {
			t.Errorf("%s is outside internal/ but neither public nor decided otherwise", rel)
		}
	}
	for _, d := range decided {
		if !slices.Contains(found, d) {
			t.Errorf("%s is listed but is no package outside internal/ any more", d)
		}
	}
	doc, err := os.ReadFile("../../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## What is public\n")
	if !ok {
		t.Fatal(`docs/architecture.md has no "## What is public" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	for _, d := range decided {
		if !strings.Contains(section, "`"+d+"`") {
			t.Errorf(`docs/architecture.md's "What is public" does not name `+"`%s`", d)
		}
	}
}

// leaks lists pkg's exported identifiers that mention an internal type.
func leaks(pkg *types.Package) []string {
	var out []string
	report := func(what string, typ types.Type) {
		if n := internalNamed(typ, map[types.Type]bool{}); n != "" {
			out = append(out, fmt.Sprintf("%s.%s uses %s", pkg.Path(), what, n))
		}
	}
	scope := pkg.Scope()
	for _, name := range scope.Names() {
		obj := scope.Lookup(name)
		if !obj.Exported() {
			continue
		}
		tn, ok := obj.(*types.TypeName)
		if !ok {
			report(name, obj.Type())
			continue
		}
		if tn.IsAlias() {
			report(name, types.Unalias(tn.Type()))
			continue
		}
		switch u := tn.Type().Underlying().(type) {
		case *types.Struct:
			for f := range u.Fields() {
				if f.Exported() {
					report(name+"."+f.Name(), f.Type())
				}
			}
		case *types.Interface:
			for m := range u.Methods() {
				if m.Exported() {
					report(name+"."+m.Name(), m.Type())
				}
			}
		default:
			report(name, u)
		}
		ms := types.NewMethodSet(types.NewPointer(tn.Type()))
		for sel := range ms.Methods() {
			if sel.Obj().Exported() {
				report(name+"."+sel.Obj().Name(), sel.Type())
			}
		}
	}
	return out
}

// internalNamed returns the first named type in typ declared in an
// internal package, as pkg.Name, or "". A named type of a public
// package is not looked into: its own package's check covers it.
func internalNamed(typ types.Type, seen map[types.Type]bool) string {
	if seen[typ] {
		return ""
	}
	seen[typ] = true
	switch t := typ.(type) {
	case *types.Alias:
		return internalNamed(types.Unalias(t), seen)
	case *types.Named:
		if obj := t.Obj(); obj.Pkg() != nil && internal(obj.Pkg().Path()) {
			return obj.Pkg().Path() + "." + obj.Name()
		}
		for a := range t.TypeArgs().Types() {
			if n := internalNamed(a, seen); n != "" {
				return n
			}
		}
	case *types.Pointer:
		return internalNamed(t.Elem(), seen)
	case *types.Slice:
		return internalNamed(t.Elem(), seen)
	case *types.Array:
		return internalNamed(t.Elem(), seen)
	case *types.Chan:
		return internalNamed(t.Elem(), seen)
	case *types.Map:
		if n := internalNamed(t.Key(), seen); n != "" {
			return n
		}
		return internalNamed(t.Elem(), seen)
	case *types.Signature:
		for _, tup := range []*types.Tuple{t.Params(), t.Results()} {
			for v := range tup.Variables() {
				if n := internalNamed(v.Type(), seen); n != "" {
					return n
				}
			}
		}
	case *types.Struct:
		for f := range t.Fields() {
			if n := internalNamed(f.Type(), seen); n != "" && f.Exported() {
				return n
			}
		}
	case *types.Interface:
		for m := range t.Methods() {
			if n := internalNamed(m.Type(), seen); n != "" && m.Exported() {
				return n
			}
		}
		for e := range t.EmbeddedTypes() {
			if n := internalNamed(e, seen); n != "" {
				return n
			}
		}
	case *types.TypeParam:
		return internalNamed(t.Constraint(), seen)
	}
	return ""
}
