package v1alpha1

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"sort"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// crdSchema is the openAPIV3Schema of the CRD in file under crds/.
func crdSchema(t *testing.T, file string) map[string]any {
	t.Helper()
	_, here, _, _ := runtime.Caller(0)
	raw, err := os.ReadFile(filepath.Join(filepath.Dir(here), "..", "..", "..", "crds", file))
	if err != nil {
		t.Fatal(err)
	}
	var crd struct {
		Spec struct {
			Versions []struct {
				Name   string
				Schema struct {
					OpenAPIV3Schema map[string]any `json:"openAPIV3Schema"`
				}
			}
		}
	}
	if err := yaml.Unmarshal(raw, &crd); err != nil {
		t.Fatal(err)
	}
	for _, v := range crd.Spec.Versions {
		if v.Name == Version {
			return v.Schema.OpenAPIV3Schema
		}
	}
	t.Fatalf("%s has no version %s", file, Version)
	return nil
}

var (
	timeType      = reflect.TypeOf(metav1.Time{})
	microTimeType = reflect.TypeOf(metav1.MicroTime{})
)

// drift lists where the Go type typ and the schema at path differ: a field only on one side,
// another type or integer format, a required field the Go side may omit, an enum.
func drift(path string, schema map[string]any, typ reflect.Type) []string {
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	kind, _ := schema["type"].(string)
	format, _ := schema["format"].(string)
	mismatch := []string{fmt.Sprintf("%s: schema %s/%s, Go %s", path, kind, format, typ)}
	switch kind {
	case "string":
		if typ == timeType || typ == microTimeType {
			if format != "date-time" {
				return mismatch
			}
			return nil
		}
		if typ.Kind() != reflect.String {
			return mismatch
		}
		return enumDrift(path, schema, typ)
	case "integer":
		want := map[string]reflect.Kind{"int32": reflect.Int32, "int64": reflect.Int64}[format]
		if typ.Kind() != want {
			return mismatch
		}
	case "boolean":
		if typ.Kind() != reflect.Bool {
			return mismatch
		}
	case "array":
		if typ.Kind() != reflect.Slice {
			return mismatch
		}
		items, _ := schema["items"].(map[string]any)
		return drift(path+"[]", items, typ.Elem())
	case "object":
		if values, ok := schema["additionalProperties"].(map[string]any); ok {
			if typ.Kind() != reflect.Map {
				return mismatch
			}
			return drift(path+"{}", values, typ.Elem())
		}
		if typ.Kind() != reflect.Struct {
			return mismatch
		}
		return objectDrift(path, schema, typ)
	default:
		return mismatch
	}
	return nil
}

func objectDrift(path string, schema map[string]any, typ reflect.Type) []string {
	props, _ := schema["properties"].(map[string]any)
	required := map[string]bool{}
	if req, ok := schema["required"].([]any); ok {
		for _, r := range req {
			required[fmt.Sprint(r)] = true
		}
	}
	var out []string
	fields := jsonFields(typ)
	for name, f := range fields {
		sub, ok := props[name].(map[string]any)
		if !ok {
			out = append(out, fmt.Sprintf("%s.%s: in Go, not in the CRD", path, name))
			continue
		}
		if required[name] && strings.Contains(f.Tag.Get("json"), "omitempty") {
			out = append(out, fmt.Sprintf("%s.%s: required by the CRD, omitempty in Go", path, name))
		}
		out = append(out, drift(path+"."+name, sub, f.Type)...)
	}
	for name := range props {
		if _, ok := fields[name]; !ok && !(path == "" && (name == "metadata" || name == "apiVersion" || name == "kind")) {
			out = append(out, fmt.Sprintf("%s.%s: in the CRD, not in Go", path, name))
		}
	}
	sort.Strings(out)
	return out
}

func enumDrift(path string, schema map[string]any, typ reflect.Type) []string {
	enum, ok := schema["enum"].([]any)
	if !ok {
		return nil
	}
	var want []string
	for _, e := range enum {
		want = append(want, fmt.Sprint(e))
	}
	var have []string
	switch typ {
	case reflect.TypeOf(ClaimPhase("")):
		for _, p := range ClaimPhases {
			have = append(have, string(p))
		}
	case reflect.TypeOf(metav1.LabelSelectorOperator("")):
		// The operators metav1 knows, which the CRD's schema of spec.fence.selector lists.
		for _, o := range []metav1.LabelSelectorOperator{
			metav1.LabelSelectorOpIn, metav1.LabelSelectorOpNotIn, metav1.LabelSelectorOpExists, metav1.LabelSelectorOpDoesNotExist,
		} {
			have = append(have, string(o))
		}
	}
	if strings.Join(want, ",") != strings.Join(have, ",") {
		return []string{fmt.Sprintf("%s: enum %v in the CRD, %v in Go", path, want, have)}
	}
	return nil
}

// jsonFields are the fields of a struct by JSON name, inlined structs flattened.
func jsonFields(typ reflect.Type) map[string]reflect.StructField {
	out := map[string]reflect.StructField{}
	for i := 0; i < typ.NumField(); i++ {
		f := typ.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if f.Anonymous && strings.Contains(opts, "inline") {
			continue // TypeMeta
		}
		if name == "metadata" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f
	}
	return out
}

// The Go types say what crds/ says: every field with its JSON name, type, integer format
// and required-ness, both ways, and the claim phases.
func TestTheGoTypesMatchTheCRDs(t *testing.T) {
	for file, obj := range map[string]any{
		"fencing.dev_fencedleases.yaml":      FencedLease{},
		"fencing.dev_fencedleaseclaims.yaml": FencedLeaseClaim{},
	} {
		if d := drift("", crdSchema(t, file), reflect.TypeOf(obj)); len(d) > 0 {
			t.Errorf("%s and %T differ:\n  %s", file, obj, strings.Join(d, "\n  "))
		}
	}
}

// The comparison fails on drift: a field renamed, one missing, a narrower integer.
func TestDriftIsFound(t *testing.T) {
	type drifted struct {
		Spec struct {
			LeaseDurationSeconds int64 `json:"leaseDurationSeconds,omitempty"`
			MinTokens            int64 `json:"minTokens,omitempty"`
		} `json:"spec"`
	}
	d := drift("", crdSchema(t, "fencing.dev_fencedleases.yaml"), reflect.TypeOf(drifted{}))
	for _, want := range []string{".spec.leaseDurationSeconds: schema integer/int32", ".spec.minTokens: in Go", ".spec.minToken: in the CRD", ".status: in the CRD"} {
		found := false
		for _, line := range d {
			found = found || strings.HasPrefix(line, want)
		}
		if !found {
			t.Errorf("drift %q not found in %q", want, d)
		}
	}
}
