package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// readmeMaxLines bounds the README: a landing page that points into
// docs/, not a manual.
const readmeMaxLines = 200

// mdLink is an inline Markdown link or image, [text](target).
var mdLink = regexp.MustCompile(`\]\(([^()\s]+)\)`)

// mdHeading is an ATX heading.
var mdHeading = regexp.MustCompile(`(?m)^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$`)

// mdProse returns a Markdown file's text outside fenced code blocks
// and inline code spans, where a link is a link.
func mdProse(text string) string {
	var b strings.Builder
	for i, block := range strings.Split(text, "```") {
		if i%2 == 1 {
			continue
		}
		for j, span := range strings.Split(block, "`") {
			if j%2 == 0 {
				b.WriteString(span)
			}
		}
	}
	return b.String()
}

// mdAnchors returns the anchors GitHub makes of a Markdown file's
// headings: lower case, letters, digits, '-' and '_' kept, spaces made
// '-', everything else dropped, and "-N" added to the Nth repeat.
func mdAnchors(text string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	var noFences strings.Builder
	for i, block := range strings.Split(text, "```") {
		if i%2 == 0 {
			noFences.WriteString(block)
		}
	}
	for _, m := range mdHeading.FindAllStringSubmatch(noFences.String(), -1) {
		var a strings.Builder
		for _, r := range strings.ToLower(m[1]) {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
				a.WriteRune(r)
			case r == ' ':
				a.WriteRune('-')
			}
		}
		s := a.String()
		if n := seen[s]; n > 0 {
			anchors[s+"-"+strconv.Itoa(n)] = true
		} else {
			anchors[s] = true
		}
		seen[s]++
	}
	return anchors
}

// TestDocLinks: every relative link of the README, the changelog and
// docs/*.md names a file of the repository. A link with a #fragment into
// a Markdown file names one of that file's headings. The README stays a
// landing page of at most readmeMaxLines lines.
func TestDocLinks(t *testing.T) {
	const root = "../.."
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil || len(files) == 0 {
		t.Fatalf("docs/*.md: %v (%d files)", err, len(files))
	}
	files = append(files, filepath.Join(root, "README.md"), filepath.Join(root, "CHANGELOG.md"))
	anchorsOf := map[string]map[string]bool{}
	anchors := func(path string) map[string]bool {
		if a, ok := anchorsOf[path]; ok {
			return a
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		anchorsOf[path] = mdAnchors(string(b))
		return anchorsOf[path]
	}
	links := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name, _ := filepath.Rel(root, f)
		for _, m := range mdLink.FindAllStringSubmatch(mdProse(string(b)), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			links++
			path, frag, _ := strings.Cut(target, "#")
			dest := f
			if path != "" {
				dest = filepath.Join(filepath.Dir(f), path)
				if _, err := os.Stat(dest); err != nil {
					t.Errorf("%s links to %s, which does not exist", name, target)
					continue
				}
			}
			if frag != "" && strings.HasSuffix(dest, ".md") && !anchors(dest)[frag] {
				t.Errorf("%s links to %s: no heading of %s makes #%s", name, target, filepath.Base(dest), frag)
			}
		}
	}
	if links == 0 {
		t.Fatal("no relative links found: the link pattern is broken")
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(readme), "\n"); n > readmeMaxLines {
		t.Errorf("README.md has %d lines, want at most %d: move detail into docs/", n, readmeMaxLines)
	}
}
