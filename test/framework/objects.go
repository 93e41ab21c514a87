package framework

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// ReadObjects decodes every object of the YAML files matched by glob
// (relative to the repo root); it fails the test when none match.
func ReadObjects(t testing.TB, glob string) []*unstructured.Unstructured {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(RepoRoot(), glob))
	if err != nil || len(files) == 0 {
		t.Fatalf("%s: %v (%d files)", glob, err, len(files))
	}
	var out []*unstructured.Unstructured
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			u := &unstructured.Unstructured{}
			if err := dec.Decode(&u.Object); err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				t.Fatalf("%s: %v", f, err)
			}
			if len(u.Object) > 0 {
				out = append(out, u)
			}
		}
	}
	return out
}
