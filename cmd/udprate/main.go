// Command udprate sends and counts fixed-size UDP datagrams at a paced
// rate, for the network benchmark's packets-per-second figure (see
// package internal/udprate for the datagram and the accounting).
//
//	udprate recv --listen ADDR:PORT --duration D [--idle D] [--batch N] [--sockbuf BYTES]
//	udprate send --to ADDR:PORT --rate PPS [--size 64] (--duration D | --count N)
//	             [--flows N] [--gso N] [--batch N] [--sockbuf BYTES]
//
// Each prints one JSON line at the end on stdout; recv first prints
// "udprate: listening on ADDR:PORT" on stderr once its socket is bound.
// A bad command line exits with status 2, a failure with status 1.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"time"

	"github.com/eipoib/eipoibd/internal/cli"

	"github.com/eipoib/eipoibd/internal/udprate"
)

// usageError is a bad command line: exit status 2.
type usageError = cli.UsageError

// errHelp ends the program successfully after printing the usage.
var errHelp = cli.ErrHelp

const usage = `usage: udprate recv --listen ADDR:PORT --duration D [flags]
       udprate send --to ADDR:PORT --rate PPS (--duration D | --count N) [flags]
Flags:
`

const maxBatch = 1024 // UIO_MAXIOV, the most messages an mmsg call takes

func main() {
	cli.Exit("udprate", run(os.Args[1:], os.Stdout, os.Stderr))
}

// command is a parsed command line: one of send and recv is set.
type command struct {
	send *udprate.SendConfig
	recv *udprate.RecvConfig
}

func parse(args []string, stderr io.Writer) (*command, error) {
	if len(args) == 0 || args[0] != "send" && args[0] != "recv" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			fmt.Fprint(stderr, usage)
			return nil, errHelp
		}
		return nil, usageError{Msg: `missing command: want "send" or "recv" (udprate send -h lists the flags)`}
	}
	var (
		addr           string
		rate           float64
		size, flows    int
		batch, sockbuf int
		gso            int
		count          uint64
		dur, idle      time.Duration
	)
	fs := flag.NewFlagSet("udprate "+args[0], flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if args[0] == "send" {
		fs.StringVar(&addr, "to", "", "destination ADDR:PORT (required)")
		fs.Float64Var(&rate, "rate", 0, "datagrams per second over all flows, 0 for as fast as possible (required)")
		fs.IntVar(&size, "size", 64, fmt.Sprintf("UDP payload bytes, %d to %d", udprate.HeaderLen, udprate.MaxSize))
		fs.IntVar(&flows, "flows", 1, fmt.Sprintf("sockets (source ports), each paced at rate/flows, 1 to %d", udprate.MaxFlows))
		fs.Uint64Var(&count, "count", 0, "stop after this many datagrams over all flows (0: no limit)")
		fs.IntVar(&gso, "gso", 0, fmt.Sprintf("datagrams per sent buffer, cut by the kernel (UDP GSO), 0 or 1 (off) to %d", udprate.MaxGSO))
	} else {
		fs.StringVar(&addr, "listen", "", "address to bind, ADDR:PORT (required)")
		fs.DurationVar(&idle, "idle", 0, "stop once datagrams came and none has for this long (0: off)")
	}
	fs.DurationVar(&dur, "duration", 0, "how long to run, e.g. 3s (send: 0 with --count is no limit)")
	fs.IntVar(&batch, "batch", 64, fmt.Sprintf("most datagrams a sendmmsg or recvmmsg call, 1 to %d", maxBatch))
	fs.IntVar(&sockbuf, "sockbuf", 4<<20, "socket buffer bytes (forced past the sysctl limits as root)")
	if err := cli.Parse(fs, args[1:], usage, stderr, "udprate "+args[0]+" -h lists the flags"); err != nil {
		return nil, err
	}
	addrFlag := map[bool]string{true: "--to", false: "--listen"}[args[0] == "send"]
	ap, err := netip.ParseAddrPort(addr)
	switch {
	case addr == "":
		return nil, usageError{Msg: addrFlag + " is required (ADDR:PORT, e.g. 10.88.0.2:5300 or [fe80::1%eth0]:5300)"}
	case err != nil:
		return nil, usageError{Msg: fmt.Sprintf("%s %q: want ADDR:PORT, e.g. 10.88.0.2:5300", addrFlag, addr)}
	case args[0] == "send" && ap.Port() == 0:
		return nil, usageError{Msg: fmt.Sprintf("--to %q: want a port from 1 to 65535", addr)}
	case batch < 1 || batch > maxBatch:
		return nil, usageError{Msg: fmt.Sprintf("--batch %d: want 1 to %d", batch, maxBatch)}
	case sockbuf < 0:
		return nil, usageError{Msg: fmt.Sprintf("--sockbuf %d: want 0 (the system's default) or more", sockbuf)}
	case dur < 0:
		return nil, usageError{Msg: fmt.Sprintf("--duration %s: want a positive duration", dur)}
	}
	if args[0] == "recv" {
		switch {
		case dur == 0:
			return nil, usageError{Msg: "--duration is required (how long to listen, e.g. 5s)"}
		case idle < 0:
			return nil, usageError{Msg: fmt.Sprintf("--idle %s: want 0 (off) or a positive duration", idle)}
		}
		return &command{recv: &udprate.RecvConfig{Listen: ap, Duration: dur, Idle: idle, Batch: batch, SockBuf: sockbuf}}, nil
	}
	rateSet := false
	fs.Visit(func(f *flag.Flag) { rateSet = rateSet || f.Name == "rate" })
	switch {
	case !rateSet:
		return nil, usageError{Msg: "--rate is required (datagrams per second, 0 for as fast as possible)"}
	case rate < 0 || rate > 1e9:
		return nil, usageError{Msg: fmt.Sprintf("--rate %g: want 0 (as fast as possible) to 1e9 datagrams/s", rate)}
	case size < udprate.HeaderLen || size > udprate.MaxSize:
		return nil, usageError{Msg: fmt.Sprintf("--size %d: want %d to %d bytes", size, udprate.HeaderLen, udprate.MaxSize)}
	case flows < 1 || flows > udprate.MaxFlows:
		return nil, usageError{Msg: fmt.Sprintf("--flows %d: want 1 to %d", flows, udprate.MaxFlows)}
	case gso < 0 || gso > udprate.MaxGSO:
		return nil, usageError{Msg: fmt.Sprintf("--gso %d: want 0 or 1 (off) to %d", gso, udprate.MaxGSO)}
	case gso*size > udprate.MaxSize:
		return nil, usageError{Msg: fmt.Sprintf("--gso %d: want --gso × --size (%d) at most %d bytes", gso, size, udprate.MaxSize)}
	case dur == 0 && count == 0:
		return nil, usageError{Msg: "--duration or --count is required (when to stop)"}
	}
	return &command{send: &udprate.SendConfig{To: ap, Rate: rate, Size: size, Flows: flows,
		Duration: dur, Count: count, Batch: batch, GSO: gso, SockBuf: sockbuf}}, nil
}

// sendOutput and recvOutput are the JSON lines printed.
type sendOutput struct {
	Mode string `json:"mode"`
	udprate.SendResult
}

type recvOutput struct {
	Mode string `json:"mode"`
	udprate.RecvResult
}

func run(args []string, stdout, stderr io.Writer) error {
	c, err := parse(args, stderr)
	if err != nil {
		return err
	}
	var out any
	if c.send != nil {
		res, err := udprate.Send(*c.send)
		if err != nil {
			return err
		}
		out = sendOutput{"send", res}
	} else {
		r, err := udprate.Listen(*c.recv)
		if err != nil {
			return err
		}
		defer r.Close()
		ap, err := r.Addr()
		if err != nil {
			return err
		}
		fmt.Fprintf(stderr, "udprate: listening on %s\n", ap)
		res, err := r.Run()
		if err != nil {
			return err
		}
		out = recvOutput{"recv", res}
	}
	return json.NewEncoder(stdout).Encode(out)
}
