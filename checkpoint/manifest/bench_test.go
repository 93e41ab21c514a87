package manifest

import (
	"path/filepath"
	"testing"
)

// BenchmarkSave: one 64 MiB file, fsyncs included (the disk decides).
func BenchmarkSave(b *testing.B) {
	dir := b.TempDir()
	data := make([]byte, 64<<20)
	b.SetBytes(int64(len(data)))
	for i := 0; b.Loop(); i++ {
		if _, err := Save(dir, int64(i), map[string]WriteFunc{"model.bin": Bytes(data)}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkVerify: re-hashing a 64 MiB checkpoint, what Latest costs per
// step it has not seen.
func BenchmarkVerify(b *testing.B) {
	dir := b.TempDir()
	data := make([]byte, 64<<20)
	if _, err := Save(dir, 1, map[string]WriteFunc{"model.bin": Bytes(data)}); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := Verify(filepath.Join(dir, StepDirName(1))); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkVerifierPoll: what the agent pays per poll once the newest
// checkpoint is verified (1000 steps in the directory).
func BenchmarkVerifierPoll(b *testing.B) {
	dir := b.TempDir()
	for s := int64(0); s < 1000; s++ {
		if _, err := Save(dir, s, map[string]WriteFunc{"m": Bytes([]byte("x"))}); err != nil {
			b.Fatal(err)
		}
	}
	v := &Verifier{}
	v.Latest(dir)
	for b.Loop() {
		if _, ok, err := v.Latest(dir); !ok || err != nil {
			b.Fatal(err)
		}
	}
}
