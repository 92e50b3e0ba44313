package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// applyConfig sets the flags of fs from the TOML file at path, each key
// a flag name, except the flags given on the command line, which win. It
// returns the keys it applied. Every problem is one line naming the file,
// the key, the value and what is allowed.
//
// A file of no bytes at all is refused, not taken as "all defaults": it
// is what a reader sees of a file being rewritten in place (truncated,
// then written: podman kube play rewrites a ConfigMap's volume so), and
// a daemon that ran on with the defaults would hide it. A file of
// comments only is the way to ask for the defaults.
func applyConfig(fl *flag.FlagSet, path string) (map[string]bool, error) {
	onLine := map[string]bool{}
	fl.Visit(func(f *flag.Flag) { onLine[f.Name] = true })
	b, err := os.ReadFile(path)
	var pathErr *fs.PathError
	switch {
	case errors.As(err, &pathErr):
		return nil, usageError{Msg: fmt.Sprintf("--config %s: %v", path, pathErr.Err)}
	case err != nil:
		return nil, usageError{Msg: fmt.Sprintf("--config %s: %v", path, err)}
	case len(b) == 0:
		return nil, usageError{Msg: fmt.Sprintf("--config %s: empty file (0 bytes): being written, or not the one meant? (a file of comments only runs with the defaults)", path)}
	}
	var m map[string]any
	if _, err := toml.Decode(string(b), &m); err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			return nil, usageError{Msg: fmt.Sprintf("--config %s: %s", path, strings.TrimPrefix(pe.Error(), "toml: "))}
		}
		return nil, usageError{Msg: fmt.Sprintf("--config %s: %v", path, err)}
	}
	applied := map[string]bool{}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		f := fl.Lookup(k)
		if f == nil || k == "config" {
			return nil, usageError{Msg: fmt.Sprintf("--config %s: unknown key %q (%s -h lists the keys, without the dashes)", path, k, fl.Name())}
		}
		v, err := configValue(m[k])
		if err != nil {
			return nil, usageError{Msg: fmt.Sprintf("--config %s: key %q: %v", path, k, err)}
		}
		if onLine[k] {
			continue
		}
		if err := fl.Set(k, v); err != nil {
			return nil, usageError{Msg: fmt.Sprintf("--config %s: key %q = %q: %v", path, k, v, setError(f, err))}
		}
		applied[k] = true
	}
	return applied, nil
}

// configValue turns a TOML value into a flag's text.
func configValue(v any) (string, error) {
	switch v := v.(type) {
	case string:
		return v, nil
	case int64:
		return strconv.FormatInt(v, 10), nil
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64), nil
	case bool:
		return strconv.FormatBool(v), nil
	case time.Duration:
		return v.String(), nil
	}
	return "", fmt.Errorf("a %T; want a string, a number or a boolean", v)
}

// setError says what a flag takes when its value did not parse.
func setError(f *flag.Flag, err error) string {
	switch f.Value.(flag.Getter).Get().(type) {
	case int:
		return "want an integer"
	case bool:
		return "want true or false"
	case time.Duration:
		return `want a duration like "90s" or "5m"`
	}
	return err.Error()
}

// withConfig applies the --config file at path, when there is one, to
// fl (flags given on the command line win), then runs check: a bad value
// that came from the file is named with the file.
func withConfig(fl *flag.FlagSet, path string, check func() error) error {
	var fromFile map[string]bool
	if path != "" {
		var err error
		if fromFile, err = applyConfig(fl, path); err != nil {
			return err
		}
	}
	err := check()
	if ue, ok := err.(usageError); ok {
		for k := range fromFile {
			if strings.HasPrefix(ue.Msg, "--"+k+" ") {
				return usageError{Msg: fmt.Sprintf("--config %s: %s", path, ue.Msg)}
			}
		}
	}
	return err
}

// checkLog reads --log-level into level and checks --log-format, for
// "run" and "host" alike.
func checkLog(logLevel, format string, level *slog.Level) error {
	if err := level.UnmarshalText([]byte(logLevel)); err != nil {
		return usageError{Msg: fmt.Sprintf("--log-level %q: want debug, info, warn or error", logLevel)}
	}
	if format != "text" && format != "json" {
		return usageError{Msg: fmt.Sprintf("--log-format %q: want text or json", format)}
	}
	return nil
}

// newLogger is the daemon's logger: text (logfmt) or JSON lines, at a
// level a reload can change.
func newLogger(format string, w io.Writer, level slog.Leveler) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
