// Package crds embeds the FencedLease and FencedLeaseClaim CustomResourceDefinitions, a
// copy of the repository's crds/ (generated from the Rust types; TestTheCopyIsCrds keeps
// them equal, go generate refreshes it), for programs that install them: envtest, e.g.
//
//	env := &envtest.Environment{CRDs: crds.MustDefinitions()}
package crds

import (
	"embed"
	"fmt"
	"io/fs"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

//go:generate sh -c "cp ../../crds/*.yaml ."

// FS holds the CRDs' YAML files, fencing.dev_<plural>.yaml, as in the repository's crds/.
//
//go:embed *.yaml
var FS embed.FS

// Definitions decodes every CRD in FS.
func Definitions() ([]*apiextensionsv1.CustomResourceDefinition, error) {
	files, err := fs.Glob(FS, "*.yaml")
	if err != nil {
		return nil, err
	}
	out := make([]*apiextensionsv1.CustomResourceDefinition, 0, len(files))
	for _, name := range files {
		raw, err := FS.ReadFile(name)
		if err != nil {
			return nil, err
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict(raw, crd); err != nil {
			return nil, fmt.Errorf("crds: %s: %w", name, err)
		}
		out = append(out, crd)
	}
	return out, nil
}

// MustDefinitions is Definitions; it panics if the embedded YAML does not decode, which
// TestDefinitionsDecode rules out.
func MustDefinitions() []*apiextensionsv1.CustomResourceDefinition {
	d, err := Definitions()
	if err != nil {
		panic(err)
	}
	return d
}
