package kernelfabric

// The unexported pieces the external tests (conformance_test.go) check.
var (
	// HostOffSysctls is hostOffSysctls.
	HostOffSysctls = hostOffSysctls
	// SetOptions is setOptions.
	SetOptions = setOptions
)
