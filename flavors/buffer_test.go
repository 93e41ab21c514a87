package flavors

import "testing"

func ptr[T any](v T) *T { return &v }

func TestAllocatable(t *testing.T) {
	cases := []struct {
		name     string
		b        Buffer
		physical int64
		want     int64
	}{
		{"H100 defaults", DefaultBuffer(), 81559, 81559 - 1500 - 8156},
		{"H200 defaults", DefaultBuffer(), 143771, 143771 - 1500 - 14378},
		{"80Gi defaults", DefaultBuffer(), 81920, 81920 - 1500 - 8192},
		{"no buffer still capped at 90%", Buffer{}, 81920, 73728},
		{"small buffer capped at 90%", Buffer{DriverOverheadMiB: 10, BufferPercent: 0}, 1000, 900},
		{"huge overhead floors at zero", Buffer{DriverOverheadMiB: 1 << 20, BufferPercent: 10}, 81920, 0},
		{"zero physical", DefaultBuffer(), 0, 0},
		{"ceil of buffer", Buffer{DriverOverheadMiB: 0, BufferPercent: 10}, 1001, 1001 - 101},
	}
	for _, tc := range cases {
		if got := tc.b.Allocatable(tc.physical); got != tc.want {
			t.Errorf("%s: Allocatable(%d) = %d, want %d", tc.name, tc.physical, got, tc.want)
		}
	}
}

func TestAllocatableNeverAbove90Percent(t *testing.T) {
	for phys := int64(1); phys < 300000; phys += 997 {
		for _, pct := range []int32{0, 1, 5, 10, 50} {
			for _, oh := range []int64{0, 1, 1500} {
				a := Buffer{DriverOverheadMiB: oh, BufferPercent: pct}.Allocatable(phys)
				if a*100 > 90*phys || a < 0 {
					t.Fatalf("Allocatable(%d, oh=%d, pct=%d) = %d breaks the 90%% line", phys, oh, pct, a)
				}
			}
		}
	}
}

func TestNewBuffer(t *testing.T) {
	if b := NewBuffer(nil, nil); b != DefaultBuffer() {
		t.Errorf("NewBuffer(nil,nil) = %+v", b)
	}
	if b := NewBuffer(ptr[int64](0), ptr[int32](5)); b != (Buffer{0, 5}) {
		t.Errorf("NewBuffer(0,5) = %+v", b)
	}
	if b := NewBuffer(ptr[int64](-1), ptr[int32](101)); b != DefaultBuffer() {
		t.Errorf("NewBuffer(-1,101) = %+v, want defaults", b)
	}
}

func TestLookup(t *testing.T) {
	for _, name := range []string{"NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3", "h100 80gb hbm3", "NVIDIA-H200", "Tesla-T4"} {
		if _, ok := Lookup(name); !ok {
			t.Errorf("Lookup(%q) not found", name)
		}
	}
	if _, ok := Lookup("Voodoo2"); ok {
		t.Error("Lookup(Voodoo2) found")
	}
	h200, _ := Lookup("NVIDIA H200")
	if q := DefaultBuffer().GPUMemoryQuotaMiB(h200.MemoryMiB, 8); q != 8*DefaultBuffer().Allocatable(h200.MemoryMiB) {
		t.Errorf("quota = %d", q)
	}
}
