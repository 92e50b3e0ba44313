# eipoibd — see README.md. `make test` is what CI runs.
GO          ?= go
GOBIN       := $(shell $(GO) env GOPATH)/bin
STATICCHECK := $(GOBIN)/staticcheck
STATICCHECK_VERSION := v0.8.2
FUZZTIME    ?= 60s

.PHONY: test deps lint unit fuzz bench

## test: install what the tests need, then lint and run every test.
test: deps lint unit

## deps: Go modules and the linters (Debian packages come with the netns tests).
deps:
	$(GO) mod download
	@test -x $(STATICCHECK) || $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

## lint: gofmt, go vet and staticcheck must be clean.
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
		if [ -n "$$out" ]; then echo "gofmt needed: $$out"; exit 1; fi
	$(GO) vet ./...
	$(STATICCHECK) ./...

## unit: every Go test, with the race detector.
unit:
	$(GO) test -race -count=1 ./...

## fuzz: run every fuzz target for FUZZTIME (default 60s) each.
fuzz:
	./scripts/fuzz.sh $(FUZZTIME)

## bench: the benchmarks, allocations included.
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...
