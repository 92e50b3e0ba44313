package main

// The table of eipoibd's subcommands: the command list of "eipoibd",
// "eipoibd --help" and "eipoibd help", each command's usage ("eipoibd
// help CMD", "eipoibd CMD -h") and the dispatch all derive from it. The
// control socket's client commands are declared in ctl.go, each beside
// its run function, and take the protocol's names from package ctl.

import (
	"flag"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/eipoib/eipoibd/internal/cli"
	"github.com/eipoib/eipoibd/internal/daemon"
)

// command is one subcommand of eipoibd.
type command struct {
	name     string
	synopsis string // its usage line, after "eipoibd "
	summary  string // its line in the command list
	about    string // what -h says between the usage line and the flags
	run      func(args []string, stderr io.Writer) error
	// ctl are the control commands (ctl.Request.Cmd) it sends, set
	// only in clientCommands; every one of the table's has a subcommand.
	ctl []string
}

// commands are eipoibd's subcommands, in the order the list gives them.
// They are set in init, as "help" reads them.
var commands []command

func init() {
	commands = slices.Concat([]command{
		{name: "run", synopsis: "run --underlay IFACE [flags]", run: runDaemon,
			summary: "run the daemon: a TAP NIC whose traffic travels over InfiniBand as IPoIB",
			about: `Runs in the foreground: creates the TAP, binds the IB port and moves
traffic until SIGINT or SIGTERM.`},
		{name: "host", synopsis: "host --underlay IFACE [flags]", run: runHost,
			summary: "run a native IPoIB host (a TUN device) on the simulated fabric",
			about: `Runs a native IPoIB host on the simulated fabric, as a Linux ib0 in
datagram mode: a TUN device for this host's own IP stack, one UD QP,
IPoIB ARP and NDP, multicast per RFC 4391. Give the device addresses
with ip(8) as usual. SIGUSR1 logs the neighbour table, SIGUSR2 the
counters.`},
		{name: "keeper", synopsis: "keeper [--socket PATH] [flags]", run: runKeeper,
			summary: "hold --persist's TAP queues across restarts where no systemd does",
			about: `Holds file descriptors for daemons where no systemd does (a second
container of the DaemonSet pod, or a service of its own): eipoibd
--persist --fd-store PATH keeps its TAP queues here, so that a restart
or a crash of eipoibd never drops the TAP's carrier. Speaks systemd's
FDSTORE=1 protocol on a datagram socket. Stopping the keeper closes what
it holds: a TAP whose eipoibd is not running then loses its carrier, and
the next eipoibd start reopens it (its carrier drops once). SIGUSR2 logs
what it holds and its counters.`},
	}, clientCommands, []command{
		{name: "version", synopsis: "version", run: runVersion,
			summary: "print the version, the Go version and the fabric backends built in",
			about:   `Also "eipoibd --version".`},
		{name: "help", synopsis: "help [COMMAND]", run: runHelp,
			summary: "list the commands, or print one's usage and flags",
			about:   `Without a COMMAND, lists the commands; with one, as "eipoibd COMMAND -h".`},
	})
}

// lookup returns the command called name.
func lookup(name string) (command, bool) {
	i := slices.IndexFunc(commands, func(c command) bool { return c.name == name })
	if i < 0 {
		return command{}, false
	}
	return commands[i], true
}

// mainUsage is the command list.
func mainUsage() string {
	var b strings.Builder
	b.WriteString(`eipoibd gives this hypervisor an Ethernet NIC (a TAP) whose traffic
travels over InfiniBand as standard IPoIB.

usage: eipoibd COMMAND [flags]

Commands:
`)
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	for _, c := range commands {
		fmt.Fprintf(tw, "  %s\t%s\n", c.name, c.summary)
	}
	tw.Flush()
	b.WriteString("\n\"eipoibd help COMMAND\" or \"eipoibd COMMAND -h\" prints a command's usage and flags.\n")
	return b.String()
}

// run dispatches the command line to its command.
func run(args []string, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, mainUsage())
		return usageError{Msg: "missing command (the list is above)"}
	}
	switch args[0] {
	case "-h", "-help", "--help":
		fmt.Fprint(stderr, mainUsage())
		return errHelp
	case "-version", "--version":
		return runVersion(args[1:], stderr)
	}
	c, ok := lookup(args[0])
	switch {
	case ok:
		return c.run(args[1:], stderr)
	case strings.HasPrefix(args[0], "-"):
		return usageError{Msg: fmt.Sprintf("missing command before %q (the daemon is \"eipoibd run\"; eipoibd help lists the commands)", args[0])}
	}
	return usageError{Msg: fmt.Sprintf("unknown command %q (eipoibd help lists the commands)", args[0])}
}

// parseFlags parses the flags of command name with fs: -h prints its
// usage line, its about text and the flags.
func parseFlags(name string, fs *flag.FlagSet, args []string, stderr io.Writer) error {
	c, _ := lookup(name)
	usage := "usage: eipoibd " + c.synopsis + "\n\n" + c.about + "\n"
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n > 0 {
		usage += "\nFlags:\n"
	}
	return cli.Parse(fs, args, usage, stderr, "eipoibd "+name+" -h lists the flags")
}

// newFlags is the flag set of command name, its errors left to
// parseFlags.
func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("eipoibd "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

// runHelp is "eipoibd help [COMMAND]".
func runHelp(args []string, stderr io.Writer) error {
	fs := newFlags("help")
	var words []string
	for len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		words, args = append(words, args[0]), args[1:]
	}
	if err := parseFlags("help", fs, args, stderr); err != nil {
		return err
	}
	switch len(words) {
	case 0:
		fmt.Fprint(stderr, mainUsage())
		return errHelp
	case 1:
		c, ok := lookup(words[0])
		if !ok {
			return usageError{Msg: fmt.Sprintf("unknown command %q (eipoibd help lists the commands)", words[0])}
		}
		return c.run([]string{"-h"}, stderr)
	}
	return usageError{Msg: fmt.Sprintf("unexpected argument %q (eipoibd help COMMAND)", words[1])}
}

// version is the release, set by make build from git describe:
// -ldflags "-X main.version=...". Without it, the module version and
// the VCS revision Go records in the binary are shown.
var version string

// runVersion is "eipoibd version" and "eipoibd --version".
func runVersion(args []string, stderr io.Writer) error {
	if err := parseFlags("version", newFlags("version"), args, stderr); err != nil {
		return err
	}
	info, _ := debug.ReadBuildInfo()
	_, err := io.WriteString(stdout, versionText(version, info))
	return err
}

// versionText says which eipoibd this is: the version (v, else the
// module's from info), the VCS revision Go recorded and the Go version.
// It also lists the fabric backends built in: the registry's, less those
// whose build tag info does not list (verbs without -tags verbs). info
// may be nil.
func versionText(v string, info *debug.BuildInfo) string {
	var rev, tags string
	modified := false
	if info != nil {
		if v == "" {
			v = info.Main.Version
		}
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			case "-tags":
				tags = s.Value
			}
		}
	}
	if v == "" || v == "(devel)" {
		v = "devel"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "eipoibd %s\n", v)
	if rev != "" {
		if modified {
			rev += " (modified)"
		}
		fmt.Fprintf(&b, "revision: %s\n", rev)
	}
	fmt.Fprintf(&b, "go: %s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	var backends []string
	for _, be := range daemon.Backends() {
		if be.Tag == "" || slices.Contains(strings.Split(tags, ","), be.Tag) {
			backends = append(backends, be.Name)
		}
	}
	fmt.Fprintf(&b, "fabric backends: %s\n", strings.Join(backends, ", "))
	return b.String()
}
