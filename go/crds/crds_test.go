package crds_test

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/fenced-lease/fenced-lease/go/crds"
)

// The embedded files are the repository's crds/, byte for byte, and no more.
func TestTheCopyIsCrds(t *testing.T) {
	want, err := filepath.Glob("../../crds/*.yaml")
	if err != nil || len(want) == 0 {
		t.Fatalf("crds/: %v %v", want, err)
	}
	embedded, _ := filepath.Glob("*.yaml")
	names := []string{}
	for _, p := range want {
		names = append(names, filepath.Base(p))
		source, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		copied, err := crds.FS.ReadFile(filepath.Base(p))
		if err != nil || !bytes.Equal(source, copied) {
			t.Errorf("go/crds/%s differs from crds/ (%v): run go generate ./crds", filepath.Base(p), err)
		}
	}
	if !slices.Equal(names, embedded) {
		t.Errorf("go/crds has %v, crds/ has %v: run go generate ./crds", embedded, names)
	}
}

func TestDefinitionsDecode(t *testing.T) {
	defs, err := crds.Definitions()
	if err != nil {
		t.Fatal(err)
	}
	kinds := []string{}
	for _, d := range defs {
		if d.Spec.Group != "fencing.dev" {
			t.Errorf("%s: group %s", d.Name, d.Spec.Group)
		}
		kinds = append(kinds, d.Spec.Names.Kind)
	}
	slices.Sort(kinds)
	if !slices.Equal(kinds, []string{"FencedLease", "FencedLeaseClaim"}) {
		t.Fatalf("kinds %v", kinds)
	}
}
