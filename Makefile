# eipoibd — see README.md. `make demo` shows it working; `make test` is
# what CI runs. Both install what they need (run as root on Debian).
SHELL       := /bin/bash
GO          ?= go
GOBIN       := $(shell $(GO) env GOPATH)/bin
STATICCHECK := $(GOBIN)/staticcheck
GOIMPORTS   := $(GOBIN)/goimports
export STATICCHECK_VERSION := v0.8.2
export GOIMPORTS_VERSION := v0.51.0
FUZZTIME    ?= 60s
# VERSION is what "eipoibd version" and "eipoib --version" print, the
# package's version and the image's tag: scripts/version.sh (the git
# tag, else the VERSION file and the commit; -dirty with uncommitted
# changes). Every target that builds a binary stamps it.
VERSION     ?= $(shell scripts/version.sh)
export VERSION
VERSION_LDFLAGS := -X main.version=$(VERSION)
CNI_LDFLAGS     := -X main.buildVersion=$(VERSION)

.PHONY: demo test test-load soak deps lint unit build fuzz bench bench-go bench-net bench-scale release deb image comment-stats

## demo: two hypervisors with two guests each on the simulated fabric.
demo:
	./scripts/demo.sh

## test: install what the tests need, lint, run every test (netns ones too).
test: deps lint unit

## deps: Debian tools for the netns tests, Go modules, staticcheck and
## goimports.
deps:
	./scripts/deps.sh --lint

## lint: gofmt, goimports (this module's imports in a group of their
## own), go vet and staticcheck must be clean.
lint:
	@out=$$(gofmt -l $$(git ls-files -co --exclude-standard '*.go' 2>/dev/null || find . -name '*.go')); \
		if [ -n "$$out" ]; then echo "gofmt needed: $$out"; exit 1; fi
	@out=$$($(GOIMPORTS) -local github.com/eipoib/eipoibd -l $$(git ls-files -co --exclude-standard '*.go' 2>/dev/null || find . -name '*.go')); \
		if [ -n "$$out" ]; then echo "goimports -local github.com/eipoib/eipoibd needed: $$out"; exit 1; fi
	@out=$$(git grep -a -l -P '\A\x7fELF' 2>/dev/null); \
		if [ -n "$$out" ]; then echo "built binaries are tracked: $$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags verbs ./...
	$(STATICCHECK) ./...
	$(STATICCHECK) -tags verbs ./...

## ONCE_TESTS: run in the first netns pass only: the QEMU tests (their
## TCG guest is the slow part and has no TAP offload setting of its own),
## the hardware kit's self-tests (the kit sets eipoibd's flags itself),
## make demo's (the demo sets them too), the guest TCP tests that run
## both offload settings themselves, and the package's and the image's
## tests (their daemons run with the package's and the manifest's flags).
ONCE_TESTS  := TestVMRxe|TestVerbsRxe|TestIPoIBNetlinkVM|TestVLANFilterVM|TestKernelBackendNoIPv6VM|TestFastPathVM|TestHWKit|TestLibvirt|TestDemo|TestOVSGuestTCP|TestBridgeGuestTCPPortMTU|TestDebPackage|TestImagePod

## unit: every Go test; the race detector on all but the netns tests,
## which drive real daemons and tools, with the TAP's offloads on (the
## default) and then off (ONCE_TESTS in the first pass only). The shim's
## allocation tests run again without the race detector, whose runtime
## allocates in the code it watches, so that "0 in 100 frames" holds.
## scripts/netns.sh gives each pass an explicit timeout and
## lists its slowest tests. Last, a 3-minute soak (scripts/soak.sh).
unit:
	$(GO) test -race -count=1 $$($(GO) list ./... | grep -v /test/netns)
	$(GO) test -count=1 -run 'NoAllocations' ./internal/shim/
	./scripts/netns.sh
	EIPOIB_NETNS_OFFLOAD=false ./scripts/netns.sh -skip '$(ONCE_TESTS)'
	./scripts/soak.sh 3m

## soak: DURATION (default 3m) of guest churn, restarts, kill -9,
## fault bursts, reloads and migrations on two hypervisors with their
## keepers and a native host, with pings, TCP flows and DHCP throughout;
## asserts nothing leaked or was lost (root; scripts/soak.sh, docs/testing.md).
## Report and plot in soak/results/<UTC timestamp>/. `make soak DURATION=30m`.
DURATION ?= 3m
soak:
	./scripts/soak.sh $(DURATION)

## test-load: the unit tests with -race -count=3, then the netns suite
## once, while stress-ng holds every core (scripts/test-load.sh; root).
## A test that depends on the scheduler fails here. docs/testing.md.
test-load:
	./scripts/test-load.sh

## build: the daemon, the daemon with the verbs backend (cgo,
## libibverbs), the benchmark's UDP generator, its ceiling (two TAPs
## joined by the shim in memory) and its fast path over an emulated
## IPoIB wire (fpemu) in bin/; the daemons and the CNI
## plugin carry VERSION
build:
	$(GO) build -ldflags "$(VERSION_LDFLAGS)" -o bin/eipoibd ./cmd/eipoibd
	$(GO) build -ldflags "$(VERSION_LDFLAGS)" -tags verbs -o bin/eipoibd-verbs ./cmd/eipoibd
	$(GO) build -o bin/udprate ./cmd/udprate
	$(GO) build -o bin/taplink ./cmd/taplink
	$(GO) build -o bin/fpemu ./cmd/fpemu
	$(GO) build -ldflags "$(CNI_LDFLAGS)" -o bin/eipoib ./cmd/eipoib-cni

## release: under dist/release/, static eipoibd and eipoib (the CNI
## plugin) for amd64 and arm64, eipoibd-verbs for amd64, the .deb
## packages, the image as an OCI archive and SHA256SUMS, after checking
## that each reports VERSION (root, for the image; docs/release.md).
release:
	./scripts/release.sh

## deb: the packages eipoibd and eipoibd-verbs in dist/, lintian clean
## of errors (docs/release.md).
deb:
	./scripts/mkdeb.sh dist

## image: the container image localhost/eipoibd:VERSION with podman,
## from a debootstrap base (cached), without a registry (root;
## docs/release.md).
image:
	./scripts/mkimage.sh

## fuzz: run every fuzz target for FUZZTIME (default 60s, or a count
## such as 200000x) each, all of them, then a summary; the Go fuzzer's own
## time-limit race (golang/go#75804) is reported apart from a crash.
fuzz:
	./scripts/fuzz.sh $(FUZZTIME)

## bench: the Go micro-benchmarks, then the network benchmark (in turn,
## even under -j: run together they would skew each other's numbers).
bench:
	$(MAKE) bench-go
	$(MAKE) bench-net

## bench-go: the Go benchmarks, allocations included.
bench-go:
	$(GO) test -run '^$$' -bench . -benchmem ./...

## bench-net: eipoibd against kernel VXLAN, a socat tunnel and its own
## ceiling between two guests on two hypervisors (root; BENCH_TIME seconds
## a test, default 3; medians of 3 interleaved repetitions, about 15
## minutes); results and the data path's goals in bench/results/<UTC
## timestamp>/ (ignored by git; docs/performance.md keeps the summary).
bench-net: build
	./scripts/bench.sh

## bench-scale: N hypervisors (default 32) on one simulated fabric, one
## guest each, every guest pinging every other once, all at once (root):
## pairs answered, wall time, CPU and drops per daemon; results in
## bench/results/scale-<UTC timestamp>/. `make bench-scale N=64`. The
## script builds bin/eipoibd itself (the simulated fabric needs no cgo).
N ?= 32
bench-scale:
	./scripts/bench-scale.sh $(N)

## comment-stats: words per sentence in Go comments and the share of
## sentences over 40 words, per package and overall. SKIP=dir,... leaves
## directories out; LONG=N also lists the N longest sentences.
comment-stats:
	$(GO) run scripts/commentstats.go -exclude '$(SKIP)' -long $(or $(LONG),0)
