/*
 * Feeds the hook's configuration parsers, for `go test -fuzz`.
 *
 *   envparse          records of  <u32 length><bytes>  (little endian) on
 *                     stdin; each record is a NUL-separated environ block.
 *   envparse file     the same records, each the text of a limits file.
 *   envparse load P [node] [ro]
 *                     one run of the whole rule (gp_config_load) with the
 *                     limits file at P and this process's environment;
 *                     "node": as the library gpupack-node installed;
 *                     "ro": require a read-only mount, as the library does.
 *   envparse marker L gp_installed_by_node(L): prints node=<0|1>.
 *
 * Output per record, one line:
 *   mem=<limit dev0>,<limit dev1> sm=<sm dev0>,<sm dev1> reserve=<n> period=<ms> log=<l> disabled=<d>
 * (limits print "none" when unlimited), in the file and load modes followed
 * by " file=<0|1> closed=<0|1> cache=<path or ->" and, when the file gives
 * GPUPACK_DEVICE_UUID_<i>, " uuids=<i>:<32 hex digits>,...". The parser's log lines
 * come first (stderr is merged into stdout); the file parser does not log,
 * so its error text is printed as a line "ERR <text>". Built with
 * ASan/UBSan too. The test program may name any path; the library itself
 * only ever reads GP_LIMITS_PATH.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../src/state.h"

extern char **environ;

static void print(const struct gp_config *c, int more)
{
	char m0[32], m1[32];
	if (c->mem_limit[0] == GP_UNLIMITED) strcpy(m0, "none"); else snprintf(m0, sizeof m0, "%llu", (unsigned long long)c->mem_limit[0]);
	if (c->mem_limit[1] == GP_UNLIMITED) strcpy(m1, "none"); else snprintf(m1, sizeof m1, "%llu", (unsigned long long)c->mem_limit[1]);
	printf("mem=%s,%s sm=%d,%d reserve=%llu period=%u log=%d disabled=%d", m0, m1, c->sm_limit[0], c->sm_limit[1],
	       (unsigned long long)c->ctx_reserve, c->sm_period_ms, c->log_level, c->disabled);
	if (more)
		printf(" file=%d closed=%d cache=%s", c->from_file, c->fail_closed, c->shared_cache[0] ? c->shared_cache : "-");
	if (c->uuid_set) {
		/* " uuids=<i>:<32 hex digits>,..." only when any is given. */
		printf(" uuids=");
		for (int i = 0, n = 0; i < GP_MAX_DEV; i++) {
			if (!(c->uuid_set & (1u << i)))
				continue;
			printf("%s%d:", n++ ? "," : "", i);
			for (int j = 0; j < 16; j++)
				printf("%02x", c->uuid[i][j]);
		}
	}
	printf("\n");
	fflush(stdout);
}

int main(int argc, char **argv)
{
	uint32_t len;
	dup2(1, 2);
	int file = argc > 1 && !strcmp(argv[1], "file");
	if (argc > 2 && !strcmp(argv[1], "marker")) {
		printf("node=%d\n", gp_installed_by_node(argv[2]));
		return 0;
	}
	if (argc > 2 && !strcmp(argv[1], "load")) {
		struct gp_config c;
		int node = 0, ro = 0;
		for (int i = 3; i < argc; i++)
			node |= !strcmp(argv[i], "node"), ro |= !strcmp(argv[i], "ro");
		gp_config_load(&c, environ, argv[2], node, ro);
		print(&c, 1);
		return 0;
	}
	while (fread(&len, 4, 1, stdin) == 1) {
		char *buf = malloc((size_t)len + 2);
		if (len && fread(buf, 1, len, stdin) != len)
			return 1;
		buf[len] = '\0';
		buf[len + 1] = '\0';
		struct gp_config c;
		if (file) {
			char err[256];
			/* An exact-size copy, so ASan sees any read past the end. */
			char *exact = malloc(len ? len : 1);
			memcpy(exact, buf, len);
			gp_config_from_file(&c, exact, len, err, sizeof err);
			free(exact);
			if (err[0])
				printf("ERR %s\n", err);
			print(&c, 1);
		} else {
			char *env[256];
			int n = 0;
			for (char *p = buf; p < buf + len && n < 255; p += strlen(p) + 1)
				env[n++] = p;
			env[n] = NULL;
			gp_config_from_env(&c, env);
			print(&c, 0);
		}
		free(buf);
	}
	return 0;
}
