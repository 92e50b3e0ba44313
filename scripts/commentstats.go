//go:build ignore

// Commentstats reports how long the sentences in Go comments are: per
// package directory and overall, the number of sentences, the mean
// words per sentence and the share of sentences over 40 words.
//
// Usage:
//
//	go run scripts/commentstats.go [-long N] [-exclude dir,...] [dir ...]
//
// It walks each dir (default ".") and skips testdata and hidden
// directories; internal/commentstats says what a sentence is. -long N
// also prints the N longest sentences, to pick what to rewrite.
package main

import (
	"flag"
	"fmt"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/eipoib/eipoibd/internal/commentstats"
)

type tally struct {
	n, words, long int
}

func (t *tally) add(words int) {
	t.n++
	t.words += words
	if words > commentstats.Over {
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
	var all []commentstats.Sentence
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
			dir := filepath.Dir(path)
			t := perDir[dir]
			if t == nil {
				t = &tally{}
				perDir[dir] = t
			}
			for _, s := range commentstats.File(fset, f) {
				t.add(s.Words)
				total.add(s.Words)
				all = append(all, s)
			}
			return nil
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	dirs := make([]string, 0, len(perDir))
	for d, t := range perDir {
		if t.n > 0 {
			dirs = append(dirs, d)
		}
	}
	sort.Strings(dirs)
	fmt.Printf("%-40s %6s %6s %6s\n", "package", "sent", "words", ">40")
	for _, d := range dirs {
		fmt.Printf("%-40s %s\n", d, perDir[d])
	}
	fmt.Printf("%-40s %s\n", "overall", total)
	if *long > 0 {
		sort.SliceStable(all, func(i, j int) bool { return all[i].Words > all[j].Words })
		if *long < len(all) {
			all = all[:*long]
		}
		fmt.Println()
		for _, s := range all {
			fmt.Printf("%3d %s: %s\n", s.Words, s.Pos, s.Text)
		}
	}
}
