/* Writes a devicehook accounting region with the C library's own code:
 * 5 MiB on device 0 and 7 MiB on device 2, in one slot of this process.
 * Built by TestParseRegionFromHook against devicehook/src. */
#include <stdio.h>
#include "state.h"
int main(int argc, char **argv) {
	struct gp_region_handle h;
	if (gp_region_open(&h, argv[1]) != 0 || !h.shared) { fprintf(stderr, "open failed\n"); return 1; }
	if (gp_region_attach(&h) != 0) return 2;
	if (gp_region_reserve(&h, 0, 5u << 20, ~0ull) != 0) return 3;
	if (gp_region_reserve(&h, 2, 7u << 20, ~0ull) != 0) return 4;
	return 0;
}
