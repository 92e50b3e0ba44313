//go:build emuib

package daemon

// Built with the emuib tag, for the tests only: --fabric kernel runs on
// the emulated IPoIB kernel of package emukernel, configured by
// $EIPOIB_EMUIB (emukernel.Config as JSON), over the emulated wire. No
// release is built with this tag.

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/emuib/emukernel"
)

func init() {
	newKernel = func(log *slog.Logger) (kernelfabric.Kernel, error) {
		env := os.Getenv("EIPOIB_EMUIB")
		if env == "" {
			return nil, errors.New("built with the emuib tag: $EIPOIB_EMUIB must configure the emulated IPoIB kernel")
		}
		var cfg emukernel.Config
		if err := json.Unmarshal([]byte(env), &cfg); err != nil {
			return nil, fmt.Errorf("$EIPOIB_EMUIB: %w", err)
		}
		log.Warn("EMULATED IPoIB: --fabric kernel runs on package emukernel's emulated kernel over veths, not on IPoIB", "config", env)
		return emukernel.NewKernel(cfg)
	}
}
