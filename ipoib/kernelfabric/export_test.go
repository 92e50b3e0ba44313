package kernelfabric

// The unexported pieces the external tests (conformance_test.go) check.
var (
	// HostOffSysctls is hostOffSysctls.
	HostOffSysctls = hostOffSysctls
	// SetOptions is setOptions.
	SetOptions = setOptions
	// SubscribeLinksBuf is subscribeLinks: System.SubscribeLinks with
	// a receive buffer of the given size.
	SubscribeLinksBuf = subscribeLinks
)
