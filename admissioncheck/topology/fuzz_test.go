package topology

import (
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Any label value (node labels are user input) gives a DNS-label name that
// Volcano's exactMatch accepts, the same every time, and distinct across
// tiers.
func FuzzHyperNodeName(f *testing.F) {
	for _, s := range []string{"d1", "LEAF.A_1", "--", "", "4f6b2c1e-9d2e-4c3f-a1b2-0123456789ab.7", "ä", "a..b"} {
		f.Add(2, leaf, s)
	}
	f.Fuzz(func(t *testing.T, tier int, level, value string) {
		if tier < 1 || tier > 16 {
			t.Skip("not a HyperNode tier (1–16): outside HyperNodeName's domain")
		}
		name := HyperNodeName(tier, level, value)
		if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
			t.Fatalf("HyperNodeName(%d, %q, %q) = %q: %v", tier, level, value, name, errs)
		}
		if again := HyperNodeName(tier, level, value); again != name {
			t.Fatalf("unstable: %q then %q", name, again)
		}
		if other := HyperNodeName(tier%16+1, level, value); other == name {
			t.Fatalf("tiers %d and %d share %q", tier, tier%16+1, name)
		}
	})
}
