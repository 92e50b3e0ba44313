//go:build ignore

// Commentstats reports how long the sentences in Go comments are: per
// package directory and overall, the number of sentences, the mean
// words per sentence and the share of sentences over 40 words.
//
// Usage:
//
//	go run scripts/commentstats.go [-long N] [-exclude dir,...] [dir ...]
//
// It walks each dir (default ".") and skips testdata, hidden
// directories, generated files and cgo preambles. A sentence ends at '.', '?' or '!'
// followed by a space, at a blank comment line and at the end of the
// comment. List items and indented code blocks in doc comments are
// not sentences. -long N also prints the N longest sentences, to pick
// what to rewrite.
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"unicode"
)

// over is the length, in words, past which a sentence counts as long.
const over = 40

type sentence struct {
	pos   string
	words int
	text  string
}

type tally struct {
	n, words, long int
}

func (t *tally) add(words int) {
	t.n++
	t.words += words
	if words > over {
		t.long++
	}
}

func (t tally) String() string {
	if t.n == 0 {
		return fmt.Sprintf("%6d %6s %6s", 0, "-", "-")
	}
	return fmt.Sprintf("%6d %6.1f %5.1f%%", t.n,
		float64(t.words)/float64(t.n), 100*float64(t.long)/float64(t.n))
}

// abbrevs end in a dot without ending a sentence.
var abbrevs = []string{"e.g.", "i.e.", "etc.", "vs.", "cf.", "Fig.", "No."}

// sentences splits the text of one comment group.
func sentences(text string) []string {
	var out []string
	var cur []string
	flush := func() {
		if len(cur) > 0 {
			out = append(out, strings.Join(cur, " "))
			cur = nil
		}
	}
	for _, line := range strings.Split(text, "\n") {
		trim := strings.TrimSpace(line)
		// A blank line ends a paragraph; an indented line is code in
		// a doc comment; a list item starts a new sentence.
		if trim == "" || line[0] == ' ' || line[0] == '\t' {
			flush()
			continue
		}
		if strings.HasPrefix(trim, "- ") || strings.HasPrefix(trim, "* ") {
			flush()
			trim = trim[2:]
		}
		for _, w := range strings.Fields(trim) {
			cur = append(cur, w)
			if endsSentence(w) {
				flush()
			}
		}
	}
	flush()
	return out
}

func endsSentence(w string) bool {
	for _, a := range abbrevs {
		if strings.HasSuffix(w, a) {
			return false
		}
	}
	w = strings.TrimRight(w, `"')]*`+"`")
	return strings.HasSuffix(w, ".") || strings.HasSuffix(w, "?") ||
		strings.HasSuffix(w, "!")
}

// cgoPreamble returns the comment above import "C", which is C code.
func cgoPreamble(f *ast.File) *ast.CommentGroup {
	for _, d := range f.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || gd.Tok != token.IMPORT {
			continue
		}
		for _, spec := range gd.Specs {
			if spec.(*ast.ImportSpec).Path.Value == `"C"` {
				if gd.Doc != nil {
					return gd.Doc
				}
				return spec.(*ast.ImportSpec).Doc
			}
		}
	}
	return nil
}

// words counts the tokens of s that hold a letter or a digit.
func words(s string) int {
	n := 0
	for _, f := range strings.Fields(s) {
		if strings.IndexFunc(f, func(r rune) bool {
			return unicode.IsLetter(r) || unicode.IsDigit(r)
		}) >= 0 {
			n++
		}
	}
	return n
}

func main() {
	long := flag.Int("long", 0, "also print the `N` longest sentences")
	exclude := flag.String("exclude", "", "comma-separated `dirs` to skip")
	flag.Parse()
	roots := flag.Args()
	if len(roots) == 0 {
		roots = []string{"."}
	}
	skip := map[string]bool{}
	for _, d := range strings.Split(*exclude, ",") {
		if d != "" {
			skip[filepath.Clean(d)] = true
		}
	}
	fset := token.NewFileSet()
	perDir := map[string]*tally{}
	var total tally
	var all []sentence
	for _, root := range roots {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				name := d.Name()
				if path != root && (name == "testdata" || strings.HasPrefix(name, ".") || skip[filepath.Clean(path)]) {
					return filepath.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(path, ".go") {
				return nil
			}
			f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
			if err != nil {
				return err
			}
			if ast.IsGenerated(f) {
				return nil
			}
			dir := filepath.Dir(path)
			t := perDir[dir]
			if t == nil {
				t = &tally{}
				perDir[dir] = t
			}
			preamble := cgoPreamble(f)
			for _, g := range f.Comments {
				if g == preamble {
					continue
				}
				for _, s := range sentences(g.Text()) {
					w := words(s)
					if w == 0 {
						continue
					}
					t.add(w)
					total.add(w)
					all = append(all, sentence{fset.Position(g.Pos()).String(), w, s})
				}
			}
			return nil
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	dirs := make([]string, 0, len(perDir))
	for d := range perDir {
		dirs = append(dirs, d)
	}
	sort.Strings(dirs)
	fmt.Printf("%-40s %6s %6s %6s\n", "package", "sent", "words", ">40")
	for _, d := range dirs {
		fmt.Printf("%-40s %s\n", d, perDir[d])
	}
	fmt.Printf("%-40s %s\n", "overall", total)
	if *long > 0 {
		sort.SliceStable(all, func(i, j int) bool { return all[i].words > all[j].words })
		if *long < len(all) {
			all = all[:*long]
		}
		fmt.Println()
		for _, s := range all {
			fmt.Printf("%3d %s: %s\n", s.words, s.pos, s.text)
		}
	}
}
