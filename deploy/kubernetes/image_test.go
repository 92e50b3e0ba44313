package kubernetes

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestImageLayout: the image make image builds here (Containerfile on
// scripts/mkbase.sh's base) and the one the Dockerfile builds elsewhere
// have the same layout: the binaries scripts/build-dist.sh builds, in
// /usr/local/bin, on a Debian with the same packages, and the same
// entry point.
func TestImageLayout(t *testing.T) {
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	docker, container := read("Dockerfile"), read("Containerfile")
	base, build := read("../../scripts/mkbase.sh"), read("../../scripts/build-dist.sh")

	var bins []string
	for _, m := range regexp.MustCompile(`-o "\$out/([a-z-]+)"`).FindAllStringSubmatch(build, -1) {
		bins = append(bins, m[1])
	}
	slices.Sort(bins)
	if want := []string{"eipoib", "eipoibd", "eipoibd-verbs"}; !slices.Equal(bins, want) {
		t.Fatalf("scripts/build-dist.sh builds %v, want %v", bins, want)
	}
	if m := regexp.MustCompile(`(?m)^COPY ((?:[a-z-]+ )+)/usr/local/bin/$`).FindStringSubmatch(container); m == nil ||
		!slices.Equal(sorted(strings.Fields(m[1])), bins) {
		t.Errorf("the Containerfile copies %q into /usr/local/bin, want %v", m, bins)
	}
	if !strings.Contains(docker, `RUN VERSION=${VERSION} scripts/build-dist.sh "$(go env GOARCH)" /out`) ||
		!strings.Contains(docker, "\nCOPY --from=build /out/ /usr/local/bin/\n") {
		t.Errorf("the Dockerfile does not copy scripts/build-dist.sh's output into /usr/local/bin")
	}

	m := regexp.MustCompile(`(?m)^packages=([a-z0-9,.+-]+)$`).FindStringSubmatch(base)
	if m == nil {
		t.Fatal("scripts/mkbase.sh: no packages= line")
	}
	want := sorted(strings.Split(m[1], ","))
	d := regexp.MustCompile(`(?m)^FROM debian:[a-z-]+\nRUN apt-get update && apt-get install -y --no-install-recommends ([a-z0-9 .+-]+) &&`).FindStringSubmatch(docker)
	if d == nil || !slices.Equal(sorted(strings.Fields(d[1])), want) {
		t.Errorf("the Dockerfile's runtime stage installs %q, want scripts/mkbase.sh's %v", d, want)
	}
	for name, f := range map[string]string{"Dockerfile": docker, "Containerfile": container} {
		if !strings.Contains(f, "\nENTRYPOINT [\"eipoibd\"]\n") {
			t.Errorf("%s: entry point is not eipoibd", name)
		}
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}
