package framework

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// TestEnsureSelfSignedPairConcurrent: many makers at once leave one
// matching pair (make test runs two packages at once on a fresh machine).
func TestEnsureSelfSignedPairConcurrent(t *testing.T) {
	for round := 0; round < 20; round++ {
		dir := filepath.Join(t.TempDir(), "certs")
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for i := 0; i < 8; i++ {
			wg.Add(1)
			go func() { defer wg.Done(); errs <- ensureSelfSignedPair(dir) }()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		if !pairOK(dir) {
			t.Fatalf("round %d: no matching pair in %s", round, dir)
		}
		left, _ := os.ReadDir(filepath.Dir(dir))
		if len(left) != 1 {
			t.Errorf("round %d: temporary directories left: %v", round, left)
		}
	}
}
