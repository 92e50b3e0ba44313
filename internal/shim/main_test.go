package shim

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind: Run
// must end every goroutine it started, however it stops.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
