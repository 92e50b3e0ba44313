// Package commentstats measures how long the sentences in Go comments
// are, for scripts/commentstats.go (make comment-stats).
//
// A comment is read as go/doc/comment reads it. A sentence ends at '.',
// '?' or '!' followed by a space, and at the end of a paragraph, heading
// or list item. Code blocks are not prose and are skipped, and so are
// the cgo preamble and generated files.
package commentstats

import (
	"go/ast"
	"go/doc/comment"
	"go/token"
	"strings"
	"unicode"
)

// Over is the length, in words, past which a sentence counts as long.
const Over = 40

// Sentence is one sentence of a comment: where its comment starts, its
// length in words and its text.
type Sentence struct {
	Pos   token.Position
	Words int
	Text  string
}

// abbrevs end in a dot without ending a sentence.
var abbrevs = []string{"e.g.", "i.e.", "etc.", "vs.", "cf.", "Fig.", "No."}

// Sentences splits text, a comment's text as ast.CommentGroup.Text
// gives it, into sentences. It reads text as go/doc/comment does:
// paragraphs, headings and list items are prose, code blocks are not.
func Sentences(text string) []string {
	var p comment.Parser
	var out []string
	for _, b := range p.Parse(text).Content {
		out = appendBlock(out, b)
	}
	return out
}

func appendBlock(out []string, b comment.Block) []string {
	switch b := b.(type) {
	case *comment.Paragraph:
		return appendText(out, b.Text)
	case *comment.Heading:
		return appendText(out, b.Text)
	case *comment.List:
		for _, item := range b.Items {
			for _, c := range item.Content {
				out = appendBlock(out, c)
			}
		}
	}
	return out
}

// appendText appends the sentences of one paragraph, heading or list
// item: the last one ends with it.
func appendText(out []string, text []comment.Text) []string {
	var cur []string
	for _, w := range strings.Fields(plain(text)) {
		cur = append(cur, w)
		if endsSentence(w) {
			out = append(out, strings.Join(cur, " "))
			cur = nil
		}
	}
	if len(cur) > 0 {
		out = append(out, strings.Join(cur, " "))
	}
	return out
}

// plain is the text of inline elements, links by their text.
func plain(text []comment.Text) string {
	var b strings.Builder
	for _, t := range text {
		switch t := t.(type) {
		case comment.Plain:
			b.WriteString(string(t))
		case comment.Italic:
			b.WriteString(string(t))
		case *comment.Link:
			b.WriteString(plain(t.Text))
		case *comment.DocLink:
			b.WriteString(plain(t.Text))
		}
	}
	return b.String()
}

func endsSentence(w string) bool {
	for _, a := range abbrevs {
		if strings.HasSuffix(w, a) {
			return false
		}
	}
	w = strings.TrimRight(w, "\"')]*`")
	return strings.HasSuffix(w, ".") || strings.HasSuffix(w, "?") ||
		strings.HasSuffix(w, "!")
}

// Words counts the tokens of s that hold a letter or a digit.
func Words(s string) int {
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

// File returns the sentences of f's comments, none for a generated
// file. f must have been parsed with parser.ParseComments into fset.
func File(fset *token.FileSet, f *ast.File) []Sentence {
	if ast.IsGenerated(f) {
		return nil
	}
	preamble := cgoPreamble(f)
	var out []Sentence
	for _, g := range f.Comments {
		if g == preamble {
			continue
		}
		for _, s := range Sentences(g.Text()) {
			if w := Words(s); w > 0 {
				out = append(out, Sentence{fset.Position(g.Pos()), w, s})
			}
		}
	}
	return out
}

// cgoPreamble returns the comment above import "C", which is C code.
func cgoPreamble(f *ast.File) *ast.CommentGroup {
	for _, d := range f.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || gd.Tok != token.IMPORT {
			continue
		}
		for _, spec := range gd.Specs {
			is := spec.(*ast.ImportSpec)
			if is.Path.Value == `"C"` {
				if gd.Doc != nil {
					return gd.Doc
				}
				return is.Doc
			}
		}
	}
	return nil
}
